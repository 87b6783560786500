"""Local deployments for demos and tests: a SuperLink and N SuperNodes on 127.0.0.1.

The same commands, with real addresses, set up a federation on several machines (README,
"Deployment"). Supports TLS (a self-signed CA made by ``make_certificates``) and SuperNode
authentication (EC keys made by ``make_node_keys``, registered with ``flwr supernode register``).
Every process is started in its own session and stopped by PID.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fedcluster_app.launcher import (
    _bin,
    connection_env,
    flwr_env,
    free_port,
    stop_process_group,
    wait_port,
)

STATE_FILE = "deployment.json"


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


def register_key(public: Path, connection: dict[str, object], home: Path | None = None) -> None:
    """Register a SuperNode's public key with the SuperLink of ``connection``: from then on a
    SuperNode holding the private key may join (`flwr supernode register`)."""
    with tempfile.TemporaryDirectory(prefix="fc-") as scratch:
        env = connection_env(home or Path(scratch), connection)
        run_flwr(["supernode", "register", str(public), "fedcluster"], env)


# ------------------------------------------------------------------------------ processes
def _start(cmd: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine. ``up()``/``down()``; state in ``dir``."""

    dir: Path
    num_nodes: int = 3
    tls: bool = False
    auth: bool = False
    port: int = 0
    node_configs: list[dict[str, str | int]] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)

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
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        if self.tls and not (self.certs / "ca.crt").is_file():
            make_certificates(self.certs)
        self.start_superlink(wait)
        for i in range(self.num_nodes):
            if self.auth:
                self.register_node(i)
            self.start_node(i)
        self.wait_online(self.num_nodes, wait)
        return self

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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        elif pid:
            stop_process_group(pid)
        self._save()

    def register_node(self, i: int) -> None:
        _, public = make_node_keys(self.dir / "keys", f"node{i}")
        register_key(public, self.connection(), self.dir / "cli")

    def start_node(self, i: int, key: Path | None = None) -> int:
        """Start SuperNode ``i`` (again); returns its PID."""
        cfg = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}"
                       for k, v in self.node_configs[i].items())
        cmd = [_bin("flower-supernode"), "--superlink", self.address, "--node-config", cfg,
               "--host", "127.0.0.1", "--port", str(free_port())]
        cmd += ["--root-certificates", str(self.certs / "ca.crt")] if self.tls else ["--insecure"]
        key = key or (self.dir / "keys" / f"node{i}" if self.auth else None)
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        self.pids[f"node{i}"] = _start(cmd, self.env(f"node{i}"), self.dir / f"node{i}.log")
        self._save()
        return self.pids[f"node{i}"]

    def stop_node(self, i: int) -> None:
        pid = self.pids.pop(f"node{i}", None)
        if pid:
            stop_process_group(pid)
        self._save()

    def online_nodes(self) -> int:
        out = run_flwr(["supernode", "list", "fedcluster", "--format", "json"], self.cli_env(),
                       check=False)
        try:
            nodes = json.loads(out).get("nodes", [])
        except json.JSONDecodeError:
            return 0
        return sum(1 for n in nodes if str(n.get("status", "")).startswith("online"))

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
            stop_process_group(self.pids[name])
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
