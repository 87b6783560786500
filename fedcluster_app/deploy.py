"""Local deployments for demos and tests: a SuperLink and N SuperNodes on 127.0.0.1.

The same commands, with real addresses, set up a federation on several machines (README,
"Deployment"). Supports TLS (a self-signed CA made by ``make_certificates``) and SuperNode
authentication (EC keys made by ``make_node_keys``, registered with ``flwr supernode register``).
Every process is started in its own session and stopped by PID (its whole process group).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

from fedcluster_app.core.server.exchange import POLL_MAX_S
from fedcluster_app.launcher import (_bin, connection_env, flwr_env, free_port, process_tree,
                                    wait_port)

STATE_FILE = "deployment.json"
# A SuperNode that dies without signing off (SIGKILL, power loss) stays "online" at the SuperLink
# until it has missed HEARTBEAT_PATIENCE heartbeats; flower-supernode sends one every
# HEARTBEAT_DEFAULT_INTERVAL s (fixed, no option), i.e. for up to 60 s in flwr 1.41.
RELEASE_TIMEOUT = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL + 30.0
# The long-lived ClientApp process each SuperNode gets, and the SuperNode that polls briefly,
# unless ``stock_supernodes`` asks for Flower's defaults
CLIENTAPP_WORKER = "fedcluster_app.clientapp_worker"
FAST_SUPERNODE = "fedcluster_app.supernode"

logger = logging.getLogger(__name__)


class DeploymentRunning(RuntimeError):
    """``up`` in a directory whose recorded deployment still runs."""


# ------------------------------------------------------------------------------ key material
def make_certificates(out: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                      days: int = 365) -> dict[str, Path]:
    """A self-signed CA (ca.crt) and a server certificate for ``hosts`` signed by it.

    Equivalent to the usual openssl recipe; done with `cryptography` so no extra tool is needed.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedcluster test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    alt = []
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(ca_key, hashes.SHA384()))
    pem = serialization.Encoding.PEM
    files = {"ca.crt": ca.public_bytes(pem), "server.pem": cert.public_bytes(pem),
             "server.key": key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()),
             "ca.key": ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption())}
    for name, data in files.items():
        (out / name).write_bytes(data)
        if name.endswith(".key"):
            os.chmod(out / name, 0o600)
    return {name: out / name for name in files}


def make_node_keys(out: Path, name: str) -> tuple[Path, Path]:
    """An EC (NIST P-384) key pair in OpenSSH format, as SuperNode authentication expects."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / name, out / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


def register_key(public: Path, connection: dict[str, object], home: Path | None = None) -> int:
    """Register a SuperNode's public key with the SuperLink of ``connection``: from then on a
    SuperNode holding the private key may join (`flwr supernode register`). Returns the node id,
    which belongs to the key: a SuperNode started again with it comes back under the same id."""
    with tempfile.TemporaryDirectory(prefix="fc-") as scratch:
        env = connection_env(home or Path(scratch), connection)
        out = run_flwr(["supernode", "register", str(public), "fedcluster", "--format", "json"],
                       env)
    return int(json.loads(out[out.index("{"):])["node-id"])


# ------------------------------------------------------------------------------ processes
def _start(cmd: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid


def group_members(pgid: int) -> list[int]:
    """The live Flower processes of process group ``pgid`` (each process we start leads its own
    group, which also holds its SuperExec and app processes). Zombies count as gone: an init
    that never reaps (as in some containers) keeps them listed forever. Only processes whose
    command line names flower/flwr count, so a reused PID is never taken for ours, and those
    whose command line is already gone (exiting: under load that takes a while, and a process
    torn down must not be left running)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)          # reap it if we started it
    proc = Path("/proc")
    if not proc.is_dir():                     # no procfs: ask the kernel whether the group exists
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) != pgid or state == "Z":
                continue
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue                           # exited meanwhile
        # an exiting process has already lost its command line but is not a zombie yet: it is
        # still ours (a reused PID leads its own group, under its own command line)
        if not cmdline or any(mark in cmdline for mark in (
                b"flower", b"flwr", CLIENTAPP_WORKER.encode(), FAST_SUPERNODE.encode())):
            members.append(int(stat.parent.name))
    return members


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGTERM process group ``pgid`` (a SuperNode then signs off at its SuperLink), wait until
    none of it is left, then SIGKILL what remains. A group with none of our processes left (a
    stale PID, maybe reused) is not signalled."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    # the leader is our child when this process started it: collect its exit status, so it
    # leaves no zombie (a zombie still answers os.kill(pid, 0))
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pgid, os.WNOHANG)


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine. ``up()``/``down()``; state in ``dir``.

    Each SuperNode runs its ClientApp in one long-lived process (``clientapp_worker``: the app
    and torch are loaded once, not for every message) and polls briefly (``supernode``);
    ``stock_supernodes``: plain `flower-supernode` instead, which starts a `flwr-clientapp`
    process per message (seconds each) and looks for messages every 3 s."""

    dir: Path
    num_nodes: int = 3
    tls: bool = False
    auth: bool = False
    port: int = 0
    node_configs: list[dict[str, str | int]] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)   # with auth: fixed by each key
    stock_supernodes: bool = False

    def __post_init__(self) -> None:
        self.dir = Path(self.dir).resolve()
        if self.auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS: use --tls with --auth")
        if not self.node_configs:
            self.node_configs = [{"client-id": i} for i in range(self.num_nodes)]
        self.num_nodes = len(self.node_configs)

    # -- paths and settings ----------------------------------------------------------------
    @property
    def certs(self) -> Path:
        return self.dir / "certs"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, name: str) -> dict[str, str]:
        home = self.dir / name
        home.mkdir(parents=True, exist_ok=True)
        return flwr_env(home)

    def connection(self) -> dict[str, object]:
        conn: dict[str, object] = {"address": self.address}
        if self.tls:
            conn["root-certificates"] = str(self.certs / "ca.crt")
        else:
            conn["insecure"] = True
        return conn

    def cli_env(self) -> dict[str, str]:
        """Environment for `flwr` commands against this deployment (connection `fedcluster`)."""
        return connection_env(self.dir / "cli", self.connection())

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self, wait: float = 120.0) -> "LocalDeployment":
        self.check_not_running()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        if self.tls and not (self.certs / "ca.crt").is_file():
            make_certificates(self.certs)
        try:
            self.start_superlink(wait)
            for i in range(self.num_nodes):
                if self.auth:
                    self.register_node(i)
                self._spawn_node(i)
            self.wait_online(self.num_nodes, wait)
        except BaseException:
            self.down()                        # nothing half-started is left behind
            raise
        return self

    def check_not_running(self) -> None:
        """Refuse to start over a deployment recorded in ``dir`` that still runs: its state
        file would be overwritten and `deploy down` could no longer stop it. A state file whose
        processes are all gone is stale and may be replaced."""
        path = self.dir / STATE_FILE
        if not path.is_file():
            return
        try:
            old = type(self).load(self.dir)
        except (OSError, ValueError, TypeError):
            return                             # unreadable: nothing we could stop either
        running = old.running()
        if running:
            listed = ", ".join(f"{name} PID {pid}" for name, pid in running.items())
            raise DeploymentRunning(
                f"a deployment already runs in {self.dir} ({listed}); stop it first with "
                f"`fedcluster deploy down --dir {self.dir}`")
        if old.pids:
            logger.warning("replacing the stale %s in %s: its processes (PIDs %s) are gone",
                           STATE_FILE, self.dir, ", ".join(map(str, old.pids.values())))

    def running(self) -> dict[str, int]:
        """The recorded processes that are still alive (name -> PID)."""
        return {name: pid for name, pid in self.pids.items() if group_members(pid)}

    def start_superlink(self, wait: float = 120.0) -> int:
        """Start the SuperLink (again: its state is in its database, so after a crash it comes
        back on the same port and the SuperNodes reconnect)."""
        link = [_bin("flower-superlink"), "--disable-runtime-dependency-installation",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--database", str(self.dir / "superlink.db")]
        if self.tls:
            link += ["--ssl-ca-certfile", str(self.certs / "ca.crt"),
                     "--ssl-certfile", str(self.certs / "server.pem"),
                     "--ssl-keyfile", str(self.certs / "server.key")]
        else:
            link += ["--insecure"]
        if self.auth:
            link += ["--enable-supernode-auth"]
        self.pids["superlink"] = _start(link, self.env("superlink"), self.dir / "superlink.log")
        self._save()
        wait_port(self.port, wait, self.dir / "superlink.log")
        return self.pids["superlink"]

    def stop_superlink(self, crash: bool = False) -> None:
        """Stop the SuperLink with everything it started (SuperExec, the running ServerApp);
        ``crash``: SIGKILL at once, as a server machine that loses power."""
        pid = self.pids.pop("superlink", None)
        if pid and crash:
            # every process it started dies with it, whatever session Flower put them in (the
            # ServerApp of a run holds its run directory's lock, as on a machine that lost power)
            for member in [pid, *process_tree(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        elif pid:
            stop_group(pid)
        self._save()

    def register_node(self, i: int) -> None:
        _, public = make_node_keys(self.dir / "keys", f"node{i}")
        self.node_ids[f"node{i}"] = register_key(public, self.connection(), self.dir / "cli")

    def start_node(self, i: int, key: Path | None = None) -> int:
        """Start SuperNode ``i`` (again, e.g. after it crashed); returns its PID."""
        name = f"node{i}"
        if (pid := self.pids.get(name)) and group_members(pid):
            raise DeploymentRunning(f"SuperNode {i} still runs (PID {pid}); stop it first")
        if key is None:
            self.wait_released(i)
        return self._spawn_node(i, key)

    def wait_released(self, i: int) -> None:
        """With authentication the node id belongs to the key, and the SuperLink activates it
        only while it is not online. A SuperNode killed without signing off stays online until
        its heartbeat expires (up to RELEASE_TIMEOUT); started before that, the new SuperNode
        is refused ("Failed to activate SuperNode") and exits. So wait for the release."""
        node_id = self.node_ids.get(f"node{i}")
        status = None if node_id is None else self.node_status(node_id)
        if status not in ("online", "offline"):
            return                             # never activated: nothing of it is pending
        if status == "online":
            logger.warning("SuperNode %d: the SuperLink still lists its node id %d as online "
                           "(the previous process died without signing off); waiting up to "
                           "%.0f s for its heartbeat to expire before starting it again", i,
                           node_id, RELEASE_TIMEOUT)
            t0, pause = time.monotonic(), 1.0
            while self.node_status(node_id) == "online":
                if time.monotonic() - t0 > RELEASE_TIMEOUT:
                    raise TimeoutError(
                        f"SuperNode {i}: the SuperLink still lists node id {node_id} as online "
                        f"after {RELEASE_TIMEOUT:.0f} s; is another SuperNode running with its "
                        f"key?")
                time.sleep(pause)
                pause = min(2 * pause, 5.0)    # each check is a `flwr` process: back off
            logger.warning("SuperNode %d: released after %.0f s; starting it", i,
                           time.monotonic() - t0)
        # the same node id comes back: let the ServerApp poll once while it is offline, so a
        # reply it still awaits from the old process fails now, not after round-timeout (a
        # deployed ServerApp pulls replies at least every POLL_MAX_S)
        time.sleep(2 * POLL_MAX_S)

    def node_status(self, node_id: int) -> str | None:
        """The SuperLink's status of ``node_id`` (online, offline, registered, ...)."""
        for node in self._list_nodes():
            if int(node.get("node-id", -1)) == node_id:
                return str(node.get("status"))
        return None

    def _spawn_node(self, i: int, key: Path | None = None) -> int:
        cfg = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}"
                       for k, v in self.node_configs[i].items())
        runtime_port = free_port()
        supernode = ([_bin("flower-supernode")] if self.stock_supernodes
                     else [sys.executable, "-m", FAST_SUPERNODE])
        cmd = [*supernode, "--superlink", self.address, "--node-config", cfg,
               "--host", "127.0.0.1", "--port", str(runtime_port)]
        cmd += ["--root-certificates", str(self.certs / "ca.crt")] if self.tls else ["--insecure"]
        key = key or (self.dir / "keys" / f"node{i}" if self.auth else None)
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        if not self.stock_supernodes:
            # the SuperNode launches no executor; the worker, its parent in one process group,
            # claims its tasks over its Runtime API (plain HTTP on 127.0.0.1, as Flower's own
            # SuperExec reaches it: the TLS above is the link to the SuperLink)
            cmd = [sys.executable, "-m", CLIENTAPP_WORKER, "--runtime-api-address",
                   f"127.0.0.1:{runtime_port}", "--insecure", "--",
                   *cmd, "--isolation", "process"]
        self.pids[f"node{i}"] = _start(cmd, self.env(f"node{i}"), self.dir / f"node{i}.log")
        self._save()
        return self.pids[f"node{i}"]

    def stop_node(self, i: int, crash: bool = False) -> None:
        """Stop SuperNode ``i``; ``crash``: SIGKILL at once (the device loses power), so it
        cannot sign off at the SuperLink."""
        pid = self.pids.pop(f"node{i}", None)
        if pid and crash:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        elif pid:
            stop_group(pid)
        self._save()

    def _list_nodes(self) -> list[dict]:
        out = run_flwr(["supernode", "list", "fedcluster", "--format", "json"], self.cli_env(),
                       check=False)
        try:
            return json.loads(out).get("nodes", [])
        except json.JSONDecodeError:
            return []

    def online_nodes(self) -> int:
        return sum(1 for n in self._list_nodes() if str(n.get("status", "")).startswith("online"))

    def wait_online(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.online_nodes() >= n:
                return
            time.sleep(1.0)
        raise TimeoutError(f"only {self.online_nodes()} of {n} SuperNodes came online within "
                           f"{timeout:.0f} s; logs in {self.dir}")

    def down(self) -> None:
        for name in sorted(self.pids, key=lambda k: k == "superlink"):  # nodes first
            stop_group(self.pids[name])
        self.pids = {}
        self._save()

    def __enter__(self) -> "LocalDeployment":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- state file (for `fedcluster deploy down`) -------------------------------------------
    def _save(self) -> None:
        data = asdict(self) | {"dir": str(self.dir)}
        (self.dir / STATE_FILE).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, directory: Path) -> "LocalDeployment":
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no deployment state in {directory} ({STATE_FILE} missing)")
        return cls(**json.loads(path.read_text()))


def run_flwr(args: list[str], env: dict[str, str], check: bool = True) -> str:
    proc = subprocess.run([_bin("flwr"), *args], env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError(f"flwr {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout
