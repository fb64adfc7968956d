"""The Spark executor: the only module that imports pyspark.

The driver (the ``replicator-compaction`` process) plans; this module ships the task
descriptions as an RDD of JSON dicts cut into ``parallelism`` partitions, and each Spark
task runs ``compaction.executors.run_task_payload`` inside the executor. That function builds
its own ``S3ObjectStore`` from the settings payload carried in the closure, streams the
inputs in ``batch_size`` batches into one output segment and returns a JSON result.

``spark_master`` is any Spark master URL: ``local[*]`` (default), ``spark://host:7077``,
``k8s://https://kubernetes.default.svc`` (client mode: the CronJob pod is the driver, see
``deploy/compaction/``). An empty ``spark_master`` leaves the master to ``spark-submit``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import uuid
from typing import Any

from pyspark.sql import SparkSession

from compaction.executors import run_task_payload, settings_payload
from compaction.merge import TaskResult, TaskSpec
from replicator.core.settings import CompactionSettings, Settings

log = logging.getLogger(__name__)

# Settings that keep a local Spark quiet and on loopback-friendly defaults; any of them can
# be overridden through ``compaction.spark_conf``.
_LOCAL_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    # Python tasks do I/O-bound merges: let one failure fail fast, the driver keeps inputs.
    "spark.task.maxFailures": "1",
}


def build_session(settings: Settings) -> tuple[SparkSession, bool]:
    """Get or create the Spark session for ``settings``; returns it and whether we created it.

    An already running session (a test fixture, ``spark-submit``'s) is reused and left
    running on ``close``.
    """
    cfg: CompactionSettings = settings.require("compaction")
    existing = SparkSession.getActiveSession()
    builder = SparkSession.builder.appName(f"replicator-compaction-{settings.region}")
    if cfg.spark_master:
        builder = builder.master(cfg.spark_master)
    conf: dict[str, str] = {}
    if cfg.spark_master.startswith("local"):
        conf.update(_LOCAL_DEFAULTS)
        # Local Python workers must run the driver's interpreter (the venv with our code);
        # PySpark reads only PYSPARK_PYTHON for that (default "python3" on PATH).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf.update(cfg.spark_conf)
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    return session, existing is None


class SparkExecutor:
    """Runs merge tasks as Spark tasks (one RDD element per task).

    Args:
        settings: process settings with ``[compaction]``.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg: CompactionSettings = settings.require("compaction")
        self.spark, self._owned = build_session(settings)
        self._group = f"replicator-compaction-{uuid.uuid4().hex[:8]}"
        self._closed = False
        self._cancel_requested = threading.Event()

    def run(self, specs: list[TaskSpec]) -> list[TaskResult]:
        """Run every task; a Spark-level failure becomes a failed result for each task.

        The job runs in a helper thread while this thread watches for ``cancel()``: a
        signal handler must not call into the JVM itself (py4j's connection of the thread
        blocked in ``collect`` is not reentrant), so it only sets a flag and the job group
        is cancelled from here.
        """
        if not specs:
            return []
        sc = self.spark.sparkContext
        slices = max(1, min(self.cfg.parallelism, len(specs)))
        task = functools.partial(run_task_payload, settings_payload(self.settings))
        data = [s.to_json() for s in specs]
        box: dict[str, Any] = {}
        done = threading.Event()

        def job() -> None:
            try:
                # Job groups are per thread: set it in the thread that submits the job.
                sc.setJobGroup(self._group, f"compaction of {self.settings.region}: "
                                            f"{len(specs)} merge tasks", interruptOnCancel=True)
                box["rows"] = sc.parallelize(data, slices).map(task).collect()
            except Exception as e:
                # Spark reports task crashes, lost executors and cancellation as one job
                # failure: every task of the job counts as failed and keeps its inputs.
                if self._cancel_requested.is_set():
                    log.info("Spark job %s cancelled: %s", self._group,
                             str(e).splitlines()[0][:300])
                else:
                    log.exception("Spark job %s failed", self._group)
                box["error"] = e
            finally:
                done.set()

        self._cancel_requested.clear()
        worker = threading.Thread(target=job, name="spark-compaction-job", daemon=True)
        worker.start()
        cancelled = False
        while not done.wait(0.2):
            if self._cancel_requested.is_set() and not cancelled:
                log.info("cancelling Spark job %s", self._group)
                sc.cancelJobGroup(self._group)
                cancelled = True
        worker.join()
        if "error" in box:
            e = box["error"]
            msg = f"Spark job failed: {type(e).__name__}: {str(e).splitlines()[0][:500]}"
            return [TaskResult(s.output, False, segments_in=len(s.inputs), error=msg)
                    for s in specs]
        return [TaskResult.from_json(r) for r in box["rows"]]

    def cancel(self) -> None:
        """Ask ``run`` to cancel the running job (signal-safe: only sets a flag)."""
        self._cancel_requested.set()

    def close(self) -> None:
        """Stop the session if this executor created it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            self.spark.stop()
