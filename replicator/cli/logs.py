"""Logging setup for the CLIs (library code only uses ``logging.getLogger(__name__)``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path


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


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger to stderr; quiet chatty libraries."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "py4j", "werkzeug"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def configure_demo_logging(path: Path) -> None:
    """INFO and up into ``path``; warnings and errors also on stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.handlers[:] = []
    fh = logging.FileHandler(path)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(threadName)s "
                                      "%(name)s: %(message)s"))
    fh.setLevel(logging.INFO)
    eh = logging.StreamHandler(sys.stderr)
    eh.setLevel(logging.ERROR)
    eh.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(fh)
    root.addHandler(eh)
    root.setLevel(logging.INFO)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
