"""Logging of the entry points (library code only uses ``logging.getLogger(__name__)``).

* The controllers (``replicator-egress``, ``-ingress``, ``-compaction``) log everything,
  the Kafka client's own lines included (``librdkafka``, routed through Python logging by
  the Kafka seam), to stderr in the configured format: stderr is their log.
* The ``replicator`` commands print their results, not client chatter: the Kafka client's
  and Spark's lines (``CLIENT_LOGGERS``) go to the command's log file when it has one (the
  demo's ``demo.log``, the stack's ``logs/replicator.log``) and nowhere else; the demo also
  sends what child processes (Spark's JVM) write to stderr into its log file.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

CLIENT_LOGGERS = ("librdkafka", "py4j", "pyspark")
"""Loggers of the Kafka client and Spark: never on a ``replicator`` command's terminal."""
CHATTY = ("botocore", "boto3", "urllib3", "s3transfer", "py4j", "werkzeug")
"""Libraries that log every request at INFO/DEBUG: WARNING and up only."""

_FILE_FORMAT = "%(asctime)s %(levelname)-7s %(threadName)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _NotFrom(logging.Filter):
    """Drops records of the given loggers (and their children)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.name == n or record.name.startswith(n + ".")
                       for n in self.names)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger to stderr (the controllers); quiet chatty libraries."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in CHATTY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def setup_command_logging(level: str = "WARNING", log_file: Path | None = None) -> None:
    """Logging of a ``replicator`` command: its own lines at ``level`` on stderr, the
    clients' lines (``CLIENT_LOGGERS``) only in ``log_file`` (or nowhere).
    """
    setup_logging(level)
    root = logging.getLogger()
    for h in root.handlers:
        h.addFilter(_NotFrom(CLIENT_LOGGERS))
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file)
        fh.setFormatter(logging.Formatter(_FILE_FORMAT))
        for name in CLIENT_LOGGERS:
            logging.getLogger(name).addHandler(fh)


def configure_demo_logging(path: Path) -> None:
    """The demo: INFO and up into ``path``, errors of our own code also on stderr.

    What is written to the process's stderr file descriptor below Python (Spark's JVM,
    which inherits it) goes to ``path`` too; ``sys.stderr`` keeps the terminal for the
    demo's own status line and errors.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _native_stderr_to(path)
    root = logging.getLogger()
    root.handlers[:] = []
    fh = logging.FileHandler(path)
    fh.setFormatter(logging.Formatter(_FILE_FORMAT))
    fh.setLevel(logging.INFO)
    eh = logging.StreamHandler(sys.stderr)
    eh.setLevel(logging.ERROR)
    eh.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    eh.addFilter(_NotFrom(CLIENT_LOGGERS))
    root.addHandler(fh)
    root.addHandler(eh)
    root.setLevel(logging.INFO)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _native_stderr_to(path: Path) -> None:
    """Point file descriptor 2 at ``path`` and ``sys.stderr`` at a copy of the old one."""
    sys.stderr.flush()
    terminal = os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = os.fdopen(terminal, "w", buffering=1, encoding="utf-8",
                           errors="backslashreplace")
