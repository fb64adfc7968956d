"""The server processes of a running stack as recorded in its state file, and stopping
them (only PIDs whose command line still matches the one recorded).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replicator.core.errors import FatalError
from replicator.devstack.processes import (
    LOOPBACK,
    BrokerKind,
    ServerProcess,
    process_cmdline,
)

log = logging.getLogger(__name__)


def broker_names(kind: BrokerKind) -> tuple[str, str]:
    """Server names of the (source, destination) brokers of a stack of ``kind``."""
    return ("tansu-source", "tansu-destination") if kind == "tansu" else \
        ("kafka-source", "kafka-destination")


# SIGTERM first, SIGKILL after the server's own grace (``ServerRecord.grace``: Tansu and
# moto 6 s, Apache Kafka 20 s, it flushes its logs), then wait this long for the exit.
STOP_GRACE_SECONDS = 6.0
KILL_WAIT_SECONDS = 5.0


class StackError(FatalError):
    """The embedded stack cannot start, or its state file is unusable."""


@dataclass
class ServerRecord:
    """One server process of the stack, as recorded in the state file."""

    name: str
    pid: int
    port: int
    cmdline: str
    log_path: Path
    process: ServerProcess | None = None  # set when this process started it (can reap it)
    grace: float = STOP_GRACE_SECONDS
    """Seconds between SIGTERM and SIGKILL."""
    data_dir: Path | None = None
    """A broker's data directory, removed once the server is stopped (Apache Kafka)."""

    @classmethod
    def of(cls, proc: ServerProcess, grace: float = STOP_GRACE_SECONDS) -> ServerRecord:
        """Record a server we just started (its command line as the kernel reports it)."""
        return cls(proc.name, proc.pid, proc.port, process_cmdline(proc.pid), proc.log_path,
                   proc, grace, proc.data_dir)

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"{LOOPBACK}:{self.port}"

    def is_ours(self) -> bool:
        """True if ``pid`` is alive and still runs the command we started.

        A PID can be reused by an unrelated process after ours exited; that one must never
        be signalled, so the command line has to match exactly.
        """
        if self.process is not None and self.process.popen is not None:
            return self.process.alive()
        if not ServerProcess(self.name, self.pid, self.port, self.log_path).alive():
            return False
        return bool(self.cmdline) and process_cmdline(self.pid) == self.cmdline

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "port": self.port, "cmdline": self.cmdline,
                               "log": str(self.log_path), "grace": self.grace}
        if self.data_dir is not None:
            out["data_dir"] = str(self.data_dir)
        return out

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> ServerRecord:
        data_dir = data.get("data_dir")
        return cls(name, int(data["pid"]), int(data["port"]), str(data["cmdline"]),
                   Path(str(data["log"])), None,
                   float(data.get("grace", STOP_GRACE_SECONDS)),
                   Path(str(data_dir)) if data_dir else None)


def stop_servers(records: Iterable[ServerRecord]) -> list[str]:
    """Stop the servers that are still ours; return the names that were running.

    All get SIGTERM at once (each broker needs seconds to exit), the ones still running
    after their ``grace`` get SIGKILL. Every signal is preceded by ``is_ours()``. Data
    directories of stopped servers are removed.
    """
    records = list(records)
    running = [r for r in records if r.is_ours()]
    for r in running:
        _signal(r, signal.SIGTERM)
    start = time.monotonic()
    while any(r.is_ours() and time.monotonic() < start + r.grace for r in running):
        time.sleep(0.05)
    stubborn = [r for r in running if r.is_ours()]
    for r in stubborn:
        log.warning("%s (pid %d) did not exit on SIGTERM, sending SIGKILL", r.name, r.pid)
        _signal(r, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while time.monotonic() < deadline and any(r.is_ours() for r in stubborn):
        time.sleep(0.05)
    for r in running:
        if r.process is not None and r.process.popen is not None:
            r.process.popen.wait(timeout=KILL_WAIT_SECONDS)  # reap our child
        if r.is_ours():
            raise StackError(f"{r.name} (pid {r.pid}) is still running after SIGKILL")
        log.info("stopped %s (pid %d)", r.name, r.pid)
    for r in records:
        if r.data_dir is not None and not r.is_ours():
            shutil.rmtree(r.data_dir, ignore_errors=True)
    return [r.name for r in running]


def _signal(r: ServerRecord, sig: signal.Signals) -> None:
    try:
        os.kill(r.pid, sig)
    except ProcessLookupError:
        log.debug("%s (pid %d) already gone before %s", r.name, r.pid, sig.name)
