"""Runs an experiment through ``flwr run`` (Ray simulation or a deployment) and waits for it.

``flwr run`` exits 0 even when the run fails, and leaves the local SuperLink it starts running.
So for simulation this module starts its own SuperLink (simulation mode, runtime dependency
installation off, private FLWR_HOME and port) and stops its whole process group afterwards; for
a deployment it submits to the connection of a profile in ``pyproject-flwr.toml``. Either way it
streams the run's log and returns the summary.json the run wrote in its ``out-dir`` (its
``status``: completed or degraded); it raises RunFailed when that says failed, or when the run
wrote none and the SuperLink does not report it completed. A simulation profile's
``ray-address`` runs the simulation on an existing Ray cluster instead of a private Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from fedcluster_app.core.config import ConfigValue
from fedcluster_app.core.hparams import toml_table
from fedcluster_app.core.plugins import is_import_path, module_files
from fedcluster_app.core.project_files import PACKAGE_DIR, project_file
from fedcluster_app.core.results.files import FLWR_LOG_FILE, SUMMARY_FILE, read_summary

FLWR_PROFILES_FILE = "pyproject-flwr.toml"


class RunFailed(RuntimeError):
    pass


def load_profiles() -> dict[str, dict[str, dict]]:
    with project_file(FLWR_PROFILES_FILE).open("rb") as fh:
        return tomllib.load(fh)


def profile(name: str) -> tuple[str, dict]:
    """(kind, settings) of a federation profile; kind is 'simulation' or 'deployment'."""
    profiles = load_profiles()
    for kind in ("simulation", "deployment"):
        if name in profiles.get(kind, {}):
            return kind, dict(profiles[kind][name])
    valid = [n for kind in ("simulation", "deployment") for n in profiles.get(kind, {})]
    raise ValueError(f"unknown federation {name!r}; valid: {', '.join(valid)}")


def stage_app(dest: Path, run_config: dict[str, ConfigValue] | None = None) -> Path:
    """Copy the app (package + pyproject.toml) into ``dest``: only what the FAB needs.

    A user's model, dataset or strategy module that is a file of their project (not
    installed) travels inside the FAB too, so the Ray workers and SuperNodes import it; a
    user's strategy's hyper-parameter table is added to the staged pyproject.toml, because
    ``flwr run`` accepts only keys the app declares."""
    dest.mkdir(parents=True, exist_ok=True)
    # fab-exclude names folders of the repository that the staged app does not have, and
    # Flower refuses a pattern that matches no file
    text = re.sub(r"^fab-exclude = .*\n", "", project_file("pyproject.toml").read_text(),
                  flags=re.MULTILINE)
    plugins = [str(v) for k, v in (run_config or {}).items()
               if k in PLUGIN_KEYS and is_import_path(v)]
    strategy = str((run_config or {}).get("strategy", ""))
    if is_import_path(strategy):
        from fedcluster_app.api import load_strategy

        params = load_strategy(strategy).Params
        if params.table:
            text += "\n" + toml_table(params, f"your strategy {strategy}") + "\n"
    (dest / "pyproject.toml").write_text(text)
    shutil.copytree(PACKAGE_DIR, dest / PACKAGE_DIR.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for plugin in plugins:
        for source, relative in module_files(plugin):
            if relative.split("/")[0] == PACKAGE_DIR.name:
                continue
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, dest / relative)
    return dest


#: run-config keys that may name a user's module
PLUGIN_KEYS = ("model", "dataset", "strategy")


# ------------------------------------------------------------------------------ processes
# Shared with deploy.py: every process fedcluster starts runs in its own session, so it and its
# children (SuperExec, ServerApp, Ray) are stopped together by process group.
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, log: Path, proc: subprocess.Popen | None = None) -> None:
    """Wait until something listens on 127.0.0.1:``port``; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RunFailed(f"{Path(str(proc.args[0])).name} exited with {proc.returncode}: "
                            f"{log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s; see {log}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child (exited, not reaped) counts as dead
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, read from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:   # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()   # after "pid (command) "
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its living descendants (by parent pid: whatever session or process
    group they put themselves in), parents first."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, state) in table.items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    tree = [pid] if pid in table and table[pid][1] != "Z" else []
    for p in tree:   # grows while it is read: breadth first
        tree.extend(sorted(children.get(p, ())))
    return tree


def _running(pid: int) -> bool:
    try:   # our own child: reap it if it exited
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def stop_process_tree(pid: int, timeout: float = 10.0) -> None:
    """Stop ``pid`` and every process it started, by PID: SIGTERM to the whole tree as it is
    before anything dies (Flower's SuperExec and simulation run in sessions of their own, and
    are re-parented once their parent is gone, so neither a process group nor a later look
    finds them all), then SIGKILL to whatever is left after ``timeout``, descendants that
    appeared meanwhile included. Without /proc: the process group of ``pid``."""
    if not Path("/proc/self/stat").exists():
        stop_process_group(pid, timeout)
        return
    pids = process_tree(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + timeout
        while True:
            alive = [p for p in pids if _running(p)]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not alive:
            return
        pids = list(dict.fromkeys(q for p in alive for q in process_tree(p)))


def stop_process_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group of ``pid``, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if not _alive(pid):
            return


def _toml_value(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_run_config(values: dict[str, ConfigValue], path: Path) -> Path:
    path.write_text("".join(f'"{k}" = {_toml_value(v)}\n' for k, v in values.items()))
    return path


def flwr_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home / "flwr"),
        RAY_TMPDIR=str(home / "ray"),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        # the SuperLink starts flower-superexec, flwr-simulation, ... by name: use this env's
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def simulation_env(home: Path, ray_address: str | None = None) -> dict[str, str]:
    """``flwr_env`` for a simulation SuperLink, whose Ray is private or an existing cluster.

    Flower 1.41 calls ``ray.init()`` in its simulation process without an address (its
    federation config has no such key), and ``ray.init()`` then takes ``RAY_ADDRESS`` from the
    environment, which the SuperLink's SuperExec and simulation processes inherit: set, the
    run's actors go to that cluster; unset, Ray starts a private instance on this machine."""
    env = flwr_env(home)
    env.pop("RAY_ADDRESS", None)   # only the profile or --ray-address attach a run
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
        # "auto" looks for the cluster `ray start` recorded in the user's Ray temp dir
        if "RAY_TMPDIR" in os.environ:
            env["RAY_TMPDIR"] = os.environ["RAY_TMPDIR"]
        else:
            env.pop("RAY_TMPDIR")
    return env


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Refuse (ValueError) a ``host:port`` nothing listens on, before a SuperLink starts: the
    simulation would fail only after Flower's start-up. ``auto`` is resolved by Ray itself."""
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as ex:
        raise ValueError(f"no Ray cluster answers at {address} ({ex.strerror or ex}); start "
                         f"one with `ray start --head`") from None


class LocalSimulationSuperLink:
    """A private simulation SuperLink; a context manager that always stops it."""

    def __init__(self, home: Path, ray_address: str | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.env = simulation_env(home, ray_address)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LocalSimulationSuperLink":
        (self.home / "flwr").mkdir(parents=True, exist_ok=True)
        (self.home / "ray").mkdir(parents=True, exist_ok=True)
        log_file = open(self.home / "superlink.log", "w")  # noqa: SIM115 (closed in __exit__)
        self._log = log_file
        self.proc = subprocess.Popen(
            [_bin("flower-superlink"), "--insecure", "--simulation",
             "--disable-runtime-dependency-installation",
             "--host", "127.0.0.1", "--port", str(self.port),
             "--database", str(self.home / "state.db")],
            env=self.env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_port(self.port, 60.0, self.home / "superlink.log", self.proc)
        except BaseException:   # a failed start, or a signal meanwhile: __exit__ will not run
            self.__exit__()
            raise
        (self.home / "flwr" / "config.toml").write_text(
            '[superlink]\ndefault = "fedcluster"\n\n'
            f'[superlink.fedcluster]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        return self

    def __exit__(self, *exc) -> None:
        # also when `fedcluster run` is stopped by a signal (core/stopping.py raises then):
        # the SuperLink with every process it started, SuperExec, simulation and Ray included
        if self.proc:
            stop_process_tree(self.proc.pid)
        self._log.close()


def run_status(env: dict[str, str], run_id: str, connection: str = "fedcluster") -> tuple[str, str]:
    """(status, details) of run ``run_id`` on the connection."""
    out = subprocess.run([_bin("flwr"), "ls", connection, "--run-id", run_id, "--format", "json"],
                         env=env, capture_output=True, text=True, check=False)
    try:
        runs = json.loads(out.stdout).get("runs", [])
    except json.JSONDecodeError:
        return "unknown", out.stdout + out.stderr
    for run in runs:
        if str(run.get("run-id")) == run_id:
            return str(run.get("status", "unknown")), str(run.get("status-details", ""))
    return "unknown", f"run {run_id} not found"


_RUN_ID = re.compile(r"started run (\d+)")


def submit_and_wait(
    run_config: dict[str, ConfigValue],
    env: dict[str, str],
    home: Path,
    connection: str = "fedcluster",
    federation_config: str | None = None,
    stop_run_on_interrupt: bool = False,
) -> dict:
    """``flwr run`` the staged app on ``connection``, stream its log; return the run's summary
    (``run_summary``), or raise RunFailed when it failed or wrote none. Stopped by a signal,
    it stops ``flwr run`` and, with ``stop_run_on_interrupt`` (a deployment, whose SuperLink
    goes on), the submitted run (``flwr stop``)."""
    out_dir = _out_dir(run_config)
    before = _file_bytes(out_dir / SUMMARY_FILE)
    app_dir = stage_app(home / "app", run_config)
    rc_file = write_run_config(run_config, home / "run-config.toml")
    cmd = [_bin("flwr"), "run", str(app_dir), connection, "--stream", "--run-config", str(rc_file)]
    if federation_config:
        cmd += ["--federation-config", federation_config]
    run_id = None
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                match = _RUN_ID.search(line)
                if match and run_id is None:
                    run_id = match.group(1)
        except BaseException:   # stopped (a signal): `flwr run` goes too, and the run it started
            stop_process_tree(proc.pid)
            if run_id is not None and stop_run_on_interrupt:
                subprocess.run([_bin("flwr"), "stop", run_id, connection], env=env,
                               capture_output=True, timeout=30, check=False)
            raise
    if run_id is None:
        raise RunFailed(f"flwr run did not start a run (exit code {proc.returncode})")
    status, details = run_status(env, run_id, connection)
    completed = proc.returncode == 0 and status.startswith("finished:completed")
    summary = run_summary(out_dir, before, completed)
    if summary is None and not completed:
        raise RunFailed(f"flwr run ended with status {status!r} (exit code {proc.returncode}): "
                        f"{details}{_log_note(home, out_dir)}")
    if summary is None:   # completed, its files written where the ServerApp ran
        summary = {"status": "completed", "out_dir": str(out_dir)}
    if summary.get("status") == "failed":
        raise RunFailed(f"{summary.get('reason') or summary.get('error')} ({out_dir / SUMMARY_FILE}"
                        f"{_log_note(home, out_dir)})")
    return summary


def _log_note(home: Path, out_dir: Path) -> str:
    """Keep the SuperLink's log of a failed run in its out-dir (the temporary folder it was
    in goes): where the message says."""
    log = home / "superlink.log"
    if not log.is_file():
        return ""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, out_dir / FLWR_LOG_FILE)
    except OSError:
        return ""
    return f"; the SuperLink's log: {out_dir / FLWR_LOG_FILE}"


def run_summary(out_dir: Path, before: bytes | None, completed: bool) -> dict | None:
    """The summary.json the run wrote in ``out_dir`` (its status decides the exit code), or
    None when it wrote none (``before``: the file's bytes before the run). An unchanged file is
    the run's only when the SuperLink reports it completed (a resumed run that had already
    finished leaves it as it was); otherwise it is an earlier run's and says nothing of this one."""
    if before is not None and _file_bytes(out_dir / SUMMARY_FILE) == before and not completed:
        return None
    return read_summary(out_dir)


def _out_dir(run_config: dict[str, ConfigValue]) -> Path:
    from fedcluster_app.core.server.runner import resolve_out_dir   # torch: only when running

    return resolve_out_dir(run_config)


def _file_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def run_with_flwr(
    run_config: dict[str, ConfigValue],
    num_supernodes: int,
    federation: str = "cpu",
    workdir: Path | None = None,
    ray_address: str | None = None,
) -> dict:
    """Run in a Ray simulation via ``flwr run``; returns the run's summary (RunFailed when it
    failed). ``ray_address`` (else the profile's ``ray-address``) attaches it to a running
    Ray cluster instead of a Ray started for this run."""
    kind, settings = profile(federation)
    if kind != "simulation":
        raise ValueError(f"federation {federation!r} is a deployment; use --engine deployment")
    ray_address = str(ray_address or settings.get("ray-address") or "") or None
    if ray_address:
        check_ray_address(ray_address)
    n = int(settings.get("num-supernodes", 0)) or num_supernodes
    fed_config = (f"num-supernodes={n} "
                  f"client-resources-num-cpus={int(settings.get('client-resources-num-cpus', 1))} "
                  f"client-resources-num-gpus={float(settings.get('client-resources-num-gpus', 0.0))}")
    # Ray's socket paths must stay short, so the private home lives in /tmp
    home = Path(tempfile.mkdtemp(prefix="fc-", dir=workdir))
    try:   # the temporary folder goes whatever happens (a failed run's log is kept: _log_note)
        with LocalSimulationSuperLink(home, ray_address) as link:
            return submit_and_wait(run_config, link.env, home, federation_config=fed_config)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_on_deployment(
    run_config: dict[str, ConfigValue],
    connection: dict[str, object] | None = None,
    federation: str = "local",
) -> dict:
    """Submit to a running SuperLink (a profile's connection, or ``connection``), wait, and
    return the run's summary (RunFailed when it failed)."""
    home = Path(tempfile.mkdtemp(prefix="fc-"))
    try:
        connection = connection or deployment_connection(federation)
        check_tls_trust(connection)
        env = connection_env(home, connection)
        return submit_and_wait(run_config, env, home, stop_run_on_interrupt=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def deployment_connection(federation: str) -> dict[str, object]:
    """The connection settings of a deployment profile in pyproject-flwr.toml."""
    kind, settings = profile(federation)
    if kind != "deployment":
        raise ValueError(f"federation {federation!r} is a simulation profile; use --engine ray")
    connection = {k: v for k, v in settings.items() if k != "description"}
    if "root-certificates" in connection:
        connection["root-certificates"] = str(Path(str(connection["root-certificates"])).resolve())
    return connection


def check_tls_trust(connection: dict[str, object], timeout: float = 10.0) -> None:
    """Refuse (ValueError) a TLS connection whose SuperLink this machine does not trust, before
    ``flwr run``: Flower reports a failed certificate check as "Please check your network
    connection", which sends the user looking in the wrong place. Nothing listening is left
    to Flower (that message is then right)."""
    if connection.get("insecure"):
        return
    address = str(connection.get("address", ""))
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return
    host = host.strip("[]")
    ca = connection.get("root-certificates")
    if ca and not Path(str(ca)).is_file():
        raise ValueError(f"root-certificates {ca}: no such file (the CA certificate of the "
                         f"SuperLink at {address})")
    import ssl

    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    context.set_alpn_protocols(["h2", "http/1.1"])   # as an HTTP client of the SuperLink
    trusted_by = f"root-certificates {ca}" if ca else "this machine's trusted certificates"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                pass
    except ssl.SSLCertVerificationError as ex:
        raise ValueError(
            f"TLS: the SuperLink at {address} presented a certificate that {trusted_by} do not "
            f"trust ({ex.verify_message}): give the CA that signed it as root-certificates in "
            f"the connection (for `fedcluster deploy up --tls`: DIR/certs/ca.crt)") from None
    except OSError:
        return   # not reachable, or another TLS failure: left to Flower


def write_connection(flwr_home: Path, conn: dict[str, object], name: str = "fedcluster") -> None:
    """Make ``name`` the default connection in ``$FLWR_HOME/config.toml``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]"]
    for key, value in conn.items():
        lines.append(f"{key} = {json.dumps(value)}")
    (flwr_home / "config.toml").write_text("\n".join(lines) + "\n")


def connection_env(home: Path, connection: dict[str, object]) -> dict[str, str]:
    """Environment for `flwr` commands with ``connection`` as the connection `fedcluster`."""
    env = flwr_env(home)
    write_connection(Path(env["FLWR_HOME"]), connection)
    return env
