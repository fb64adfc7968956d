"""The compaction controller: plan on the driver, merge on an executor, then delete inputs.

``Compaction(settings).start(); .run()`` runs on ``compaction.schedule`` until ``stop()``;
``run_once()`` is one pass now (``replicator-compaction --once``). A run:

1. takes the region lock (``{prefix}/{region}/_compaction.lock``), or is skipped;
2. lists the configured topics of this region only and plans each partition
   (``compaction.planner``); reads the footers of segments that would be deleted unread and
   of what covers them, and keeps (ERROR, ``replicator_compaction_conflicts_total``) what
   cannot hold the same records (``planner.verify_plan``);
3. runs the merge tasks on the executor (Spark, or in-process with ``spark_master =
   "inline"``); each publishes its output before it reports success;
4. deletes the inputs of each successful task, then leftovers covered by higher levels
   (with ``[catalog]`` on, once the topic's Iceberg table lists the outputs instead: one
   snapshot per topic and incarnation, ``replicator.archive.committer``);
5. releases the lock and records metrics.

A run that dies anywhere leaves every input whose output is not published, and the next
run recognises published outputs (higher-level segments covering inputs) and finishes
their cleanup; a task that failed leaves its range to the next run, which plans it again
even when later ranges were compacted (``compaction.planner``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol

from compaction.executors import Executor, ExecutorFactory, default_executor
from compaction.lock import RegionLock, lock_key
from compaction.merge import TaskResult, TaskSpec
from compaction.metrics import CompactionMetrics
from compaction.planner import (
    FooterOrError,
    Listed,
    PartitionPlan,
    footers_to_check,
    plan_all,
    verify_plan,
)
from compaction.replication import replicated
from compaction.report import RunReport, RunScope, planned
from formats.registry import get_format
from formats.segment_io import read_footer
from replicator.core.clock import Clock, utc_now
from replicator.core.cron import CronSchedule, parse_cron
from replicator.core.errors import (
    ConfigError,
    ReplicatorError,
    SegmentCorrupt,
    SegmentNotFound,
)
from replicator.core.keys import SegmentKey, incarnations_prefix, region_prefix, topic_prefix
from replicator.core.metrics import Metrics, MetricsServer
from replicator.core.settings import CompactionSettings, CompactionTopicSettings, Settings
from replicator.core.storage import ObjectStore

log = logging.getLogger(__name__)


class ArchiveHook(Protocol):
    """Keeps the topics' Iceberg tables in step with compaction's deletes
    (``replicator.archive.committer.ArchiveCommitter``; docs/archive.md).
    """

    def swap(self, region: str, topic: str, deleting: list[SegmentKey]) -> Any:
        """One snapshot lists what covers ``deleting`` (segments of one incarnation)
        instead of it; ``None``: no table lists them (deletes go ahead). Raises
        ``ReplicatorError`` if it did not commit (then nothing may be deleted).
        """

    def deletable(self, region: str, topic: str, swap: Any) -> set[str]:
        """The keys of ``swap``'s segments that may be deleted now (their snapshots are
        older than the table's retention, and expired).
        """

    def after_delete(self, region: str, topic: str, swap: Any) -> int:
        """Expire the snapshots older than ``swap`` (they list deleted objects)."""


ArchiveFactory = Callable[[Settings, ObjectStore, Metrics], ArchiveHook]

Swapped = tuple[str, str]
"""What one swap is about: (topic, incarnation location label); each incarnation's
segments are swapped on their own (with ``{incarnation}`` in ``catalog.table_name`` each
has a table of its own)."""


def _swapped(p: PartitionPlan) -> Swapped:
    return p.partition.topic, p.partition.incarnation


def _name(group: Swapped) -> str:
    topic, incarnation = group
    return f"{topic} (incarnation {incarnation})" if incarnation else topic


class Compaction:
    """Compaction of one region's segments, on a cron schedule or once.

    Args:
        settings: process settings with a ``[compaction]`` section.
        store: the region's bucket (default: ``S3ObjectStore.from_settings`` at ``start``).
        metrics: metric registry (default: a new one).
        clock: current timezone-aware time (schedule, segment ages, lock expiry).
        wait: blocks up to the given seconds; returns ``True`` if the controller was
            stopped meanwhile (default: waits on the stop event).
        executor_factory: builds the task executor for a run (default
            ``default_executor``).
        scope: narrows every scheduled run (CLI options).
        serve_metrics: serve /metrics, /healthz, /readyz while running (if the port is
            not 0).
        archive_factory: builds, at ``start``, what keeps the topics' Iceberg tables in
            step with deletes; required when ``[catalog]`` is enabled (the entry points
            pass ``replicator.cli.archive.archive_factory``).

    Raises:
        ConfigError: the settings have no ``[compaction]`` section.
    """

    def __init__(self, settings: Settings, *, store: ObjectStore | None = None,
                 metrics: Metrics | None = None, clock: Clock = utc_now,
                 wait: Callable[[float], bool] | None = None,
                 executor_factory: ExecutorFactory = default_executor,
                 scope: RunScope | None = None, serve_metrics: bool = True,
                 archive_factory: ArchiveFactory | None = None) -> None:
        self.settings = settings
        self.cfg: CompactionSettings = settings.require("compaction")
        self.schedule: CronSchedule = parse_cron(self.cfg.schedule)
        self.store = store
        self.metrics = metrics or Metrics()
        self.m = CompactionMetrics(self.metrics, settings.region)
        self.clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self.executor_factory = executor_factory
        self.scope = scope or RunScope()
        self.serve_metrics = serve_metrics
        self.archive_factory = archive_factory
        self.archive: ArchiveHook | None = None
        self._server: MetricsServer | None = None
        self._executor: Executor | None = None
        self._started = False
        self._failed = False
        self._closed = False
        self.last_report: RunReport | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to the bucket and check the format; serve metrics. Fails fast.

        Raises:
            ConfigError: unknown format.
            StorageError / StorageFatalError: the bucket is unreachable.
        """
        get_format(self.settings.format.name)
        if self.store is None:
            from replicator.core.s3 import S3ObjectStore

            self.store = S3ObjectStore.from_settings(self.settings)
        next(iter(self.store.list(region_prefix(self.settings.s3.prefix,
                                                self.settings.region))), None)
        self._archive_hook()
        if self.serve_metrics and self.settings.metrics.port and self._server is None:
            self._server = MetricsServer(self.metrics, self.settings.metrics.host,
                                         self.settings.metrics.port,
                                         healthy=lambda: not self._failed,
                                         ready=lambda: self._started)
            self._server.start()
        self._started = True
        log.info("compaction of region %s started: schedule %r (%s), topics %s, master %s",
                 self.settings.region, self.schedule.expression,
                 "seconds-first" if self.schedule.seconds_first else "standard crontab",
                 ", ".join(sorted(self.cfg.topics)), self.cfg.spark_master)

    def _archive_hook(self) -> ArchiveHook | None:
        """The archive hook (built on first use) when ``[catalog]`` is enabled.

        Raises:
            ConfigError: enabled, but this controller has no ``archive_factory``.
        """
        if self.archive is None and self.settings.catalog.enabled:
            if self.archive_factory is None:
                # Deleting inputs a table lists would leave it pointing at missing objects.
                raise ConfigError("catalog.enabled", "this compaction was built without the "
                                  "archive tables' hook; run it with replicator-compaction")
            assert self.store is not None
            self.archive = self.archive_factory(self.settings, self.store, self.metrics)
        return self.archive

    def run(self) -> None:
        """Run on the schedule until ``stop()``; a failed run waits for the next slot."""
        if not self._started:
            self.start()
        while not self._stop.is_set():
            nxt = self.schedule.next_after(self.clock())
            log.info("next compaction run at %s", nxt.isoformat())
            if self._wait_until(nxt):
                break
            self.run_once(self.scope.topic, self.scope.partition, self.scope.min_level,
                          self.scope.max_level)

    def _wait_until(self, t: datetime) -> bool:
        """Wait until ``t``; ``True`` if stopped first."""
        while True:
            remaining = (t - self.clock()).total_seconds()
            if remaining <= 0:
                return self._stop.is_set()
            if self._wait(remaining) or self._stop.is_set():
                return True

    def stop(self) -> None:
        """Stop after the current step (signal-safe): running tasks are cancelled."""
        self._stop.set()
        executor = self._executor
        if executor is not None:
            executor.cancel()

    @property
    def stopped(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stop.is_set()

    def close(self) -> None:
        """Stop serving metrics and release the executor; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_executor()
        if self._server is not None:
            self._server.close()
            self._server = None

    def _close_executor(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    # --- one run --------------------------------------------------------------------------

    def topic_settings(self, scope: RunScope) -> dict[str, CompactionTopicSettings]:
        """The topics a run covers, with ``--min-level``/``--max-level`` applied.

        Raises:
            ConfigError: an unknown ``--topic`` or an impossible level range.
        """
        topics = dict(self.cfg.topics)
        if scope.topic is not None:
            if scope.topic not in topics:
                raise ConfigError("--topic", f"topic {scope.topic!r} is not in "
                                             f"[compaction.topics] (known: "
                                             f"{', '.join(sorted(topics)) or 'none'})")
            topics = {scope.topic: topics[scope.topic]}
        if scope.partition is not None and scope.partition < 0:
            raise ConfigError("--partition", f"must be >= 0, got {scope.partition}")
        out = {}
        for name, t in topics.items():
            lo = t.min_level if scope.min_level is None else scope.min_level
            hi = t.max_level if scope.max_level is None else scope.max_level
            if lo < 0 or lo > hi:
                raise ConfigError("--min-level/--max-level",
                                  f"topic {name}: level range {lo}..{hi} is empty")
            out[name] = t.model_copy(update={"min_level": lo, "max_level": hi})
        return out

    def run_once(self, topic: str | None = None, partition: int | None = None,
                 min_level: int | None = None, max_level: int | None = None,
                 dry_run: bool = False) -> RunReport:
        """One compaction pass now; see the module docstring for the steps.

        Storage and task failures make the outcome ``failed`` (the report says why); they
        are not raised, so a scheduler keeps running.

        Raises:
            ConfigError: bad scope (unknown topic, empty level range).
        """
        scope = RunScope(topic, partition, min_level, max_level)
        topics = self.topic_settings(scope)
        if self.store is None:
            self.start()
        assert self.store is not None
        t0 = time.monotonic()
        now = self.clock()
        report = RunReport(self.settings.region, now.isoformat(), dry_run=dry_run)
        lock: RegionLock | None = None
        try:
            # Step 1
            if not dry_run:
                lock = RegionLock(self.store, lock_key(self.settings.s3.prefix,
                                                       self.settings.region),
                                  self.cfg.lock_ttl, self.clock)
                if not lock.acquire():
                    holder = lock.holder
                    report.outcome = "skipped"
                    who = f" ({holder.owner} until {holder.expires_at})" if holder else ""
                    report.reason = f"another compaction run holds the region lock{who}"
                    return report
                lock.keep_alive(max(1.0, self.cfg.lock_ttl.total_seconds() / 3))
            # Step 2
            plans = self._plan(topics, scope.partition, now, report)
            if dry_run:
                return report
            # Step 3
            results = self._execute(plans, topics, report)
            # Step 4
            self._delete(plans, topics, results, report, lock)
            if any(t.outcome in ("failed", "not-run") for t in report.tasks):
                report.outcome = "failed"
                report.reason = ("stopped: unfinished merges keep their inputs"
                                 if self._stop.is_set()
                                 else "some merge tasks failed; their inputs stay")
        except ReplicatorError as e:
            log.error("compaction run of region %s failed: %s", self.settings.region, e,
                      exc_info=True)
            report.outcome = "failed"
            report.reason = str(e)
            report.errors.append(str(e))
        except BaseException as e:
            # Not ours to handle (a bug, KeyboardInterrupt): count the run as failed, then
            # let it propagate.
            report.outcome = "failed"
            report.reason = f"{type(e).__name__}: {e}"
            raise
        finally:
            # Step 5
            if lock is not None:
                self._release(lock)
            self._close_executor()
            report.duration_seconds = round(time.monotonic() - t0, 3)
            self._record(report)
        return report

    def _release(self, lock: RegionLock) -> None:
        try:
            lock.release()
        except ReplicatorError as e:
            log.warning("could not release compaction lock %s (%s); it expires after "
                        "lock_ttl", lock.key, e)

    def _record(self, report: RunReport) -> None:
        self.last_report = report
        if report.dry_run:
            log.info("dry run of region %s: %d tasks, %d leftovers to delete",
                     report.region, len(report.tasks), len(report.covered_to_delete))
            return
        self.m.runs.labels(report.region, report.outcome).inc()
        self.m.duration.labels(report.region).observe(report.duration_seconds)
        if report.outcome == "success":
            self.m.last_success.labels(report.region).set(self.clock().timestamp())
        log.info("compaction run of region %s: %s in %.1fs (%d tasks, %d segments deleted)%s",
                 report.region, report.outcome, report.duration_seconds, len(report.tasks),
                 len(report.deleted), f": {report.reason}" if report.reason else "")

    def _list(self, topic: str, partition: int | None) -> Iterator[Listed]:
        """Every segment of one topic of this region (optionally one partition: that
        partition of every incarnation, the documented shape's and each
        ``_incarnations/{topic_id}/``'s, listed one prefix each).
        """
        assert self.store is not None
        s3 = self.settings.s3
        prefix = topic_prefix(s3.prefix, self.settings.region, topic)
        prefixes = [prefix]
        if partition is not None:
            later = incarnations_prefix(s3.prefix, self.settings.region, topic)
            prefixes = [f"{prefix}{partition}/"] + [
                f"{later}{label}/{partition}/" for label in self.store.list_folders(later)]
        for where in prefixes:
            for info in self.store.list(where):
                key = SegmentKey.try_parse(info.key)
                if key is None or key.prefix != s3.prefix or \
                        key.region != self.settings.region or key.topic != topic:
                    continue   # _topic.json and anything that is not a segment of this topic
                yield Listed(key, info.size, info.last_modified)

    def _plan(self, topics: dict[str, CompactionTopicSettings], partition: int | None,
              now: datetime, report: RunReport) -> list[PartitionPlan]:
        plans: list[PartitionPlan] = []
        for name in sorted(topics):
            for listed in plan_all(self._list(name, partition), topics[name], now):
                p = self._verify(listed, report)
                plans.append(p)
                ref = p.partition
                where = f"{ref.topic}[{ref.partition}]"
                for hole in p.holes_reported:
                    log.warning("%s: no segment holds positions %d-%d (a missing segment); "
                                "the run before it ends there, compaction continues after it",
                                where, hole.start, hole.end)
                    self.m.holes.labels(self.settings.region, ref.topic,
                                        str(ref.partition)).inc()
                    report.holes.append(f"{where} {hole.start}-{hole.end}")
                for t in p.tasks:
                    log.info("%s: plan %s", where, t.describe())
                    report.tasks.append(planned(t))
                report.covered_to_delete.extend(k.to_key() for k in p.covered_to_delete)
                if p.skipped_reason:
                    log.info("%s: not merged: %s", where, p.skipped_reason)
                    report.skipped.append(f"{where}: {p.skipped_reason}")
        report.partitions = len(plans)
        return plans

    def _verify(self, p: PartitionPlan, report: RunReport) -> PartitionPlan:
        """The plan without what contradicts what covers it (``planner.verify_plan``): reads
        the footers of what would be deleted unread and of what covers it, only those.
        """
        keys = footers_to_check(p)
        if not keys:
            return p
        assert self.store is not None
        footers: dict[SegmentKey, FooterOrError] = {}
        for key in keys:
            try:
                footers[key] = read_footer(self.store, key)
            except SegmentNotFound:
                # Deleted meanwhile (another run, an operator): left out of ``footers``,
                # which verify_plan reads as gone.
                log.debug("%s: gone before its footer was read", key)
            except SegmentCorrupt as e:
                footers[key] = str(e)
        verified, conflicts = verify_plan(p, footers)
        ref = p.partition
        for c in conflicts:
            log.error("%s[%d]: %s. A topic recreated or a partition truncated or reset "
                      "reuses positions; compare them (replicator segments inspect) and "
                      "delete the one that is not wanted", ref.topic, ref.partition,
                      c.describe())
            self.m.conflicts.labels(self.settings.region, ref.topic, str(ref.partition)).inc()
            report.errors.append(c.describe())
        return verified

    def _execute(self, plans: list[PartitionPlan], topics: dict[str, CompactionTopicSettings],
                 report: RunReport) -> dict[str, TaskResult]:
        specs = [TaskSpec([k.to_key() for k in t.inputs], list(t.input_sizes),
                          t.output.to_key(), topics[t.output.topic].batch_size,
                          self.settings.s3.storage_class_for(t.output.level))
                 for p in plans for t in p.tasks]
        if not specs or self._stop.is_set():
            for pt in report.tasks:
                pt.outcome = "not-run" if specs else pt.outcome
            return {}
        assert self.store is not None
        self._executor = self.executor_factory(self.settings, self.store)
        if self._stop.is_set():   # stopped while the executor started
            self._executor.cancel()
        results = {r.output: r for r in self._executor.run(specs)}
        region = self.settings.region
        for pt in report.tasks:
            r = results.get(pt.output)
            if r is None:
                pt.outcome, pt.error = "failed", "no result from the executor"
            elif not r.ok:
                pt.outcome, pt.error = "failed", r.error
                report.errors.append(f"{pt.output}: {r.error}")
                if r.conflict:
                    out = SegmentKey.parse(pt.output)
                    self.m.conflicts.labels(region, out.topic, str(out.partition)).inc()
            else:
                pt.outcome = "existing" if r.existing else "merged"
                pt.records, pt.bytes_out = r.records, r.bytes_out
                if not r.existing:
                    self.m.segments_read.labels(region, pt.topic).inc(r.segments_in)
                    self.m.bytes_read.labels(region, pt.topic).inc(r.bytes_in)
                    self.m.segments_written.labels(region, pt.topic).inc()
                    self.m.bytes_written.labels(region, pt.topic).inc(r.bytes_out)
                    self.m.records_written.labels(region, pt.topic).inc(r.records)
            self.m.tasks.labels(region, pt.topic, pt.outcome).inc()
        return results

    def _delete(self, plans: list[PartitionPlan], topics: dict[str, CompactionTopicSettings],
                results: dict[str, TaskResult], report: RunReport,
                lock: RegionLock | None) -> None:
        """Delete merged inputs and covered leftovers, only while the lock is still ours and
        only once the output that holds them replicated (``compaction.replication``).
        """
        assert self.store is not None
        region = self.settings.region
        ready: list[tuple[PartitionPlan, str, SegmentKey, list[str]]] = []
        for p in plans:
            t_cfg = topics[p.partition.topic]
            if not t_cfg.delete:
                continue
            batches: list[tuple[str, SegmentKey, list[str]]] = []
            for t in p.tasks:
                r = results.get(t.output.to_key())
                if r is not None and r.ok:
                    batches.append(("merged", t.output,
                                    [k.to_key() for k in (*t.inputs, *t.covered)]))
            by_cover: dict[SegmentKey, list[str]] = {}
            for k in p.covered_to_delete:
                by_cover.setdefault(p.covering[k], []).append(k.to_key())
            batches.extend(("covered", cover, keys) for cover, keys in by_cover.items())
            ready.extend((p, reason, output, keys) for reason, output, keys in batches
                         if self._replicated(output, len(keys), report))
        swapped = self._swap_tables(ready, report)
        allowed = self._deletable(swapped, report)
        attempted: set[Swapped] = set()
        try:
            for p, reason, output, keys in ready:
                if not self._may_delete(p, keys, swapped, allowed, report):
                    continue
                if lock is not None and not lock.confirm():
                    raise _LockLost(f"region lock {lock.key} lost before deleting "
                                    f"{len(keys)} segments of {p.partition}; they stay")
                attempted.add(_swapped(p))
                self.store.delete_many(keys)
                report.deleted.extend(keys)
                self.m.segments_deleted.labels(region, p.partition.topic, reason).inc(len(keys))
                log.info("%s[%d]: deleted %d %s segments (into %s)", p.partition.topic,
                         p.partition.partition, len(keys), reason, output)
        finally:
            # Whatever stopped the deletes, no snapshot may keep listing what was deleted.
            self._expire_tables({t: s for t, s in swapped.items() if t in attempted})

    def _swap_tables(self, ready: list[tuple[PartitionPlan, str, SegmentKey, list[str]]],
                     report: RunReport) -> dict[Swapped, Any]:
        """With ``[catalog]`` on, one snapshot per topic and incarnation lists the outputs
        instead of what is about to be deleted (``replicator.archive.committer``; each
        incarnation's segments are swapped in the table that lists them, which the hook
        chooses by the keys' incarnation); the (topic, incarnation) pairs whose deletes may
        go ahead, with their swap (``None``: no table lists them). One whose table could
        not be swapped keeps its inputs.
        """
        groups = sorted({_swapped(p) for p, _, _, _ in ready})
        archive = self._archive_hook()
        if archive is None or not ready:
            return dict.fromkeys(groups)
        out: dict[Swapped, Any] = {}
        for group in groups:
            keys = [SegmentKey.parse(k) for p, _, _, ks in ready
                    if _swapped(p) == group for k in ks]
            try:
                out[group] = archive.swap(self.settings.region, group[0], keys)
            except ReplicatorError as e:
                log.error("%s: its Iceberg table could not list the compaction outputs "
                          "instead of their %d inputs (%s); the inputs stay until a run "
                          "swaps them", _name(group), len(keys), e)
                report.errors.append(f"{_name(group)}: table swap failed: {e}")
        return out

    @staticmethod
    def _may_delete(p: PartitionPlan, keys: list[str], swapped: dict[Swapped, Any],
                    allowed: dict[Swapped, set[str]], report: RunReport) -> bool:
        """Whether a batch of ``p`` may be deleted now: its table was swapped (or there is
        none), still lists none of it, and lets it go (catalog.snapshot_retention).
        """
        group = _swapped(p)
        if group not in swapped:
            return False
        kept = set(getattr(swapped[group], "kept", ()) or ()) & set(keys)
        if kept:
            # The table still lists them: their output could not be listed.
            report.errors.append(f"{p.partition}: {len(kept)} inputs kept: the table "
                                 "cannot list their output")
            return False
        may = allowed.get(group)
        # Within catalog.snapshot_retention: a later run deletes them.
        return may is None or set(keys) <= may

    def _deletable(self, swapped: dict[Swapped, Any], report: RunReport
                   ) -> dict[Swapped, set[str]]:
        """Per swap, the keys the table lets go now (``ArchiveHook.deletable``)."""
        out: dict[Swapped, set[str]] = {}
        if self.archive is None:
            return out
        for group, swap in swapped.items():
            if swap is None:
                continue
            try:
                out[group] = self.archive.deletable(self.settings.region, group[0], swap)
            except ReplicatorError as e:
                log.error("%s: could not tell which swapped-out segments may be deleted (%s); "
                          "they stay until a later run", _name(group), e)
                report.errors.append(f"{_name(group)}: table retention check failed: {e}")
                out[group] = set()
        return out

    def _expire_tables(self, swapped: dict[Swapped, Any]) -> None:
        """Snapshots older than a swap list deleted inputs: expired (``[catalog]`` on)."""
        if self.archive is None:
            return
        for group, swap in swapped.items():
            if swap is None:
                continue
            try:
                self.archive.after_delete(self.settings.region, group[0], swap)
            except ReplicatorError as e:
                log.warning("%s: snapshots older than the compaction swap not expired (%s); "
                            "the next commit that removes files expires them", _name(group), e)

    def _replicated(self, output: SegmentKey, inputs: int, report: RunReport) -> bool:
        assert self.store is not None
        verdict = replicated(self.store.head(output.to_key()), self.clock(),
                             self.cfg.replication_grace)
        if verdict.failed:
            # S3 never retries a FAILED object: unlike PENDING, no later run fixes this.
            log.error("%s: S3 replication of this output FAILED and S3 never retries it: the "
                      "other region does not get it, and its %d inputs stay here until the "
                      "replication is re-driven (S3 Batch Replication, or a copy of the "
                      "object onto itself; docs/deploy.md, \"S3 replication\")", output,
                      inputs)
            self.m.replication_failed.labels(self.settings.region, output.topic).inc()
            report.errors.append(f"{output}: replication FAILED; {inputs} inputs stay until "
                                 f"it is re-driven")
        elif not verdict.delete:
            log.info("%s: its %d inputs stay until it is safe in the other region (%s); a "
                     "later run deletes them", output, inputs, verdict.why)
        if not verdict.delete:
            report.skipped.append(f"{output}: {inputs} inputs wait for replication "
                                  f"({verdict.why})")
        return verdict.delete


class _LockLost(ReplicatorError):
    """The region lock was taken over during the run."""
