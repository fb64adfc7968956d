"""Where merge tasks run: the ``Executor`` interface, the in-process ``LocalExecutor``,
and what a remote (Spark) task runs (``run_task_payload``: JSON in, JSON out).

``default_executor`` chooses from ``compaction.spark_master``: ``"inline"`` merges in this
process, anything else on Spark (``compaction.spark_job``, the only pyspark user).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from compaction.merge import InputsDisagree, TaskResult, TaskSpec, merge_segments
from formats.base import WriterOptions
from formats.registry import get_format
from replicator.core.errors import ConfigError
from replicator.core.settings import CompactionSettings, Settings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)

INLINE_MASTER = "inline"
"""``spark_master`` value that runs merge tasks in this process, without Spark."""


class Executor(Protocol):
    """Runs merge tasks somewhere (in-process, on Spark) and returns one result per task."""

    def run(self, specs: list[TaskSpec]) -> list[TaskResult]:
        """Run all tasks; a failed task gives a result with ``ok=False``, never raises."""
        ...

    def cancel(self) -> None:
        """Ask running tasks to stop (signal-safe); their results come back as failures."""
        ...

    def close(self) -> None:
        """Release resources; idempotent."""
        ...


def run_task(store: ObjectStore, settings: Settings, spec: TaskSpec,
             stopped: Callable[[], bool] = lambda: False) -> TaskResult:
    """``merge_segments`` with the settings' format, reporting any failure as a result."""
    t0 = time.monotonic()
    try:
        fmt = get_format(settings.format.name)
        return merge_segments(store, fmt, WriterOptions.from_settings(settings.format),
                              settings.s3.temp_prefix, spec, stopped)
    except Exception as e:
        # The task boundary: whatever went wrong is logged with its traceback and reported
        # to the driver, which then keeps this task's inputs and counts the failure.
        log.exception("merge into %s failed", spec.output)
        return TaskResult(spec.output, False, segments_in=len(spec.inputs),
                          seconds=time.monotonic() - t0, error=f"{type(e).__name__}: {e}",
                          conflict=isinstance(e, InputsDisagree))


# --- settings across the process boundary -------------------------------------------------


def settings_payload(settings: Settings) -> dict[str, Any]:
    """What a remote task needs of the settings, as JSON (secrets included, unmasked)."""
    data = settings.model_dump(mode="json", include={"region", "s3", "kafka", "format"})
    for name in ("access_key_id", "secret_access_key"):
        secret = getattr(settings.s3, name)
        data["s3"][name] = secret.get_secret_value() if secret is not None else None
    return data


def settings_from_payload(payload: dict[str, Any]) -> Settings:
    """Rebuild ``Settings`` from ``settings_payload``."""
    return Settings.model_validate(payload)


_STORES: dict[str, tuple[Settings, ObjectStore]] = {}


def run_task_payload(payload: dict[str, Any], spec_json: dict[str, Any]) -> dict[str, Any]:
    """Entry point inside a remote (Spark) task: JSON in, JSON out.

    The store is built once per worker process and settings (a boto3 client is thread-safe
    and costs tens of milliseconds to build).
    """
    from replicator.core.s3 import S3ObjectStore

    cache_key = json.dumps(payload, sort_keys=True)
    if cache_key not in _STORES:
        s = settings_from_payload(payload)
        _STORES[cache_key] = (s, S3ObjectStore.from_settings(s))
    settings, store = _STORES[cache_key]
    return run_task(store, settings, TaskSpec.from_json(spec_json)).to_json()


# --- in-process executor --------------------------------------------------------------------


class LocalExecutor:
    """Runs merge tasks in this process on a thread pool (``spark_master = "inline"``, tests).

    Args:
        store: the region's bucket.
        settings: the process settings (format, temp prefix).
        parallelism: tasks at once.
    """

    def __init__(self, store: ObjectStore, settings: Settings, parallelism: int = 1) -> None:
        self.store = store
        self.settings = settings
        self.parallelism = max(1, parallelism)
        self._cancelled = False

    def run(self, specs: list[TaskSpec]) -> list[TaskResult]:
        self._cancelled = False

        def one(spec: TaskSpec) -> TaskResult:
            return run_task(self.store, self.settings, spec, lambda: self._cancelled)

        if self.parallelism == 1 or len(specs) <= 1:
            return [one(s) for s in specs]
        with ThreadPoolExecutor(self.parallelism, thread_name_prefix="merge") as pool:
            return list(pool.map(one, specs))

    def cancel(self) -> None:
        self._cancelled = True

    def close(self) -> None:
        return None


ExecutorFactory = Callable[[Settings, ObjectStore], Executor]


def default_executor(settings: Settings, store: ObjectStore) -> Executor:
    """``LocalExecutor`` for ``spark_master = "inline"``, else ``SparkExecutor``.

    Raises:
        ConfigError: Spark is asked for but pyspark is not installed.
    """
    cfg: CompactionSettings = settings.require("compaction")
    if cfg.spark_master == INLINE_MASTER:
        return LocalExecutor(store, settings, cfg.parallelism)
    try:
        from compaction.spark_job import SparkExecutor
    except ImportError as e:
        raise ConfigError("compaction.spark_master",
                          f"pyspark is not installed ({e}); install the 'compaction' extra "
                          f"or set spark_master = \"{INLINE_MASTER}\"") from e
    return SparkExecutor(settings)
