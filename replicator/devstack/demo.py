"""``replicator demo``: the whole pipeline on the embedded stack, verified record by record.

1. Start the embedded stack (or reuse the one ``replicator local up`` started).
2. Create a fresh source topic and produce a realistic sample into it.
3. Meanwhile run egress (source region), the bucket sync (source bucket → destination
   bucket) and ingress (destination region), each in its own thread of this process.
4. Once every record is in a segment, run one compaction pass (Spark local) on the source
   bucket while ingress may still be replaying; the sync carries the merged segment and
   the deletes of the level-0 ones across.
5. Wait until ingress has replayed every record, stop everything, compare the destination
   topic with the source record by record, and print a summary. PASS only when nothing is
   lost, duplicated or reordered.
"""

from __future__ import annotations

import logging
import resource
import tempfile
import threading
import time
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from replicator.core.kafka import Admin
from replicator.core.keys import SegmentKey, topic_prefix
from replicator.core.s3 import S3ObjectStore
from replicator.core.settings import Settings, validate_settings
from replicator.core.storage import ObjectStore
from replicator.devstack.configs import DATA_PREFIX, DEST_REGION, SOURCE_REGION, Role
from replicator.devstack.demo_report import DemoResult, levels_text
from replicator.devstack.processes import DEFAULT_BROKER, BrokerKind
from replicator.devstack.sample import produce_sample, sample_records
from replicator.devstack.stack import DEFAULT_DIR, LocalStack
from replicator.ops.sync import BucketSync
from replicator.ops.verify import verify_topics

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.5


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs."""

    records: int = 300_000
    partitions: int = 6
    value_size: int = 400
    delivery: str = "exactly-once"
    compaction: bool = True
    stack_dir: Path = DEFAULT_DIR
    keep_stack: bool = False
    timeout: float = 900.0
    seed: int = 7
    kafka: BrokerKind = DEFAULT_BROKER
    """The embedded stack's brokers when the demo starts one (``tansu`` or ``apache``)."""


class Controller(Protocol):
    """What the demo runs on a thread (the three controllers and the bucket sync)."""

    def start(self) -> None: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def _archive_factory(settings: Settings, store: ObjectStore, metrics: Any) -> Any:
    from replicator.archive.committer import ArchiveCommitter

    return ArchiveCommitter(settings, store, metrics=metrics)


class _Running:
    """A controller's ``run`` on a thread, with its error kept."""

    def __init__(self, name: str, controller: Controller) -> None:
        self.name = name
        self.controller = controller
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"demo-{name}", daemon=True)

    def _run(self) -> None:
        try:
            self.controller.run()
        except BaseException as e:  # reported as a FAIL by the demo, with the traceback logged
            log.exception("%s failed", self.name)
            self.error = e

    def stop(self, timeout: float = 60.0) -> None:
        self.controller.stop()
        self.thread.join(timeout)
        self.controller.close()


class _SyncController:
    """``BucketSync.follow`` behind the controller shape."""

    def __init__(self, syncer: BucketSync) -> None:
        self.syncer = syncer
        self._stop = threading.Event()

    def start(self) -> None:
        return

    def run(self) -> None:
        self.syncer.follow(0.5, self._stop.is_set, sleep=self._pause)

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        return


class Demo:
    """Runs the demo; ``say`` prints progress lines, ``status`` rewrites the status line."""

    def __init__(self, options: DemoOptions, *, say: Callable[[str], None],
                 status: Callable[[str], None]) -> None:
        self.o = options
        self.say = say
        self.status = status
        self.result = DemoResult()
        self.run_id = uuid.uuid4().hex[:6]
        self._produced = 0
        self._owned_stack = False
        self._stack: LocalStack | None = None
        self._running: list[_Running] = []

    # --- the steps ----------------------------------------------------------------------

    def run(self) -> DemoResult:
        r = self.result
        r.log_path = self.o.stack_dir.absolute() / "demo.log"
        try:
            stack = self._stack = self._open_stack()
            r.topic = f"demo.sensor-events.{self.run_id}"
            r.destination_topic = r.topic + ".copy"
            self._run_pipeline(stack)
        except Exception as e:  # any failure becomes a FAIL with its reason, never a traceback
            log.exception("demo failed")
            r.errors.append(f"{type(e).__name__}: {e}")
        finally:
            for running in reversed(self._running):
                running.stop()
            if self._stack is not None and self._owned_stack and not self.o.keep_stack:
                self.say("stopping the embedded stack")
                self._stack.stop()
            r.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return r

    def _open_stack(self) -> LocalStack:
        existing = LocalStack.load(self.o.stack_dir)
        if existing is not None and existing.is_up():
            if existing.kafka == self.o.kafka:
                self.say(f"using the running embedded stack in {existing.dir}")
                return existing
            self.say(f"the running stack in {existing.dir} has {existing.kafka} brokers, not "
                     f"{self.o.kafka}: starting a separate one")
        directory = Path(tempfile.mkdtemp(prefix="replicator-demo-"))
        brokers = "Apache Kafka" if self.o.kafka == "apache" else "Tansu"
        self.say(f"starting the embedded stack: 2 Kafka brokers ({brokers}) and S3+SQS "
                 "(moto) …")
        t0 = time.monotonic()
        stack = LocalStack.start(directory, partitions=1, kafka=self.o.kafka)
        self._owned_stack = True
        self.say(f"  up in {time.monotonic() - t0:.1f}s (state in {directory})")
        return stack

    def _settings(self, stack: LocalStack, role: Role) -> Settings:
        raw: dict[str, Any] = tomllib.loads(stack.config_paths[role].read_text())
        topic = self.result.topic
        raw["metrics"]["port"] = 0
        if role == "egress":
            raw["egress"]["group_id"] = f"demo.egress.{self.run_id}"
            # About eight segments per partition, so compaction has something to merge.
            per_partition = -(-self.o.records // self.o.partitions)
            raw["egress"]["topics"] = {topic: {"max_segment_messages":
                                               max(100, min(50_000, per_partition // 8)),
                                               "max_segment_size": "8MiB",
                                               "max_segment_age": "2s"}}
        elif role == "ingress":
            raw["ingress"]["group_id"] = f"demo.ingress.{self.run_id}"
            raw["ingress"]["delivery"] = self.o.delivery
            src = raw["ingress"]["sources"][0]
            src.update(topic=topic, destination_topic=self.result.destination_topic,
                       first_segment_delay="1s")
        else:
            raw["compaction"]["topics"] = {topic: {
                "min_level": 0, "max_level": 0, "min_segment_age": "1s",
                "min_segment_count": 2, "min_segment_size": 1, "max_segment_count": 1000,
                "max_segment_size": "1GiB", "batch_size": 10_000, "delete": True}}
            if self._archive_available():
                # The archive as an Iceberg table (docs/archive.md).
                raw["catalog"] = {
                    "enabled": True, "namespace": "demo", "table_name": "{topic}",
                    "topics": [topic],
                    # No reader pinned to an older snapshot here: inputs go at once.
                    "snapshot_retention": "0s",
                    "properties": {"uri": f"sqlite:///{stack.dir.absolute()}/catalog.sqlite"}}
        return validate_settings(raw)

    @staticmethod
    def _archive_available() -> bool:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("pyiceberg", "duckdb"))

    def _archive_query(self, stack: LocalStack, store: ObjectStore) -> None:
        """One query over the source topic's Iceberg table: its records per partition,
        which must add up to what was produced.
        """
        settings = self._settings(stack, "compaction")
        if not settings.catalog.enabled:
            self.say("(the archive table is skipped: the 'archive' extra is not installed)")
            return
        from replicator.archive.committer import ArchiveCommitter
        from replicator.archive.query import run_query
        committer = ArchiveCommitter(settings, store)
        committer.sync(SOURCE_REGION, self.result.topic)
        table = committer.table(SOURCE_REGION, self.result.topic, create=False)
        assert table is not None
        name = table.identifier[-1]
        sql = (f'SELECT partition, count(*) AS records, min("offset") AS first, '
               f'max("offset") AS last FROM {name} GROUP BY partition ORDER BY partition')
        answer = run_query(committer, sql)
        self.say(f"the archive as an Iceberg table ({table.name}, {len(table.files())} "
                 f"files, the segments themselves): {sql}")
        for row in [answer.result.columns, *answer.result.rows]:
            self.say("  " + "  ".join(f"{v!s:>9}" for v in row))
        total = sum(int(row[1]) for row in answer.result.rows)
        if total != self.result.produced.records:
            self.result.errors.append(f"the archive table holds {total} records, "
                                      f"{self.result.produced.records} were produced")

    def _run_pipeline(self, stack: LocalStack) -> None:  # noqa: C901 - the demo's one loop
        r, o = self.result, self.o
        eg_settings = self._settings(stack, "egress")
        in_settings = self._settings(stack, "ingress")
        Admin(eg_settings.kafka).create_topic(r.topic, o.partitions)
        self.say(f"source topic {r.topic} ({o.partitions} partitions) in {SOURCE_REGION}; "
                 f"copy {r.destination_topic} in {DEST_REGION}; delivery {o.delivery}")

        from egress.controller import Egress
        from ingress.controller import Ingress

        src_store = S3ObjectStore.from_settings(eg_settings)
        dst_store = S3ObjectStore.from_settings(in_settings)
        egress = Egress(eg_settings, store=src_store)
        ingress = Ingress(in_settings, store=dst_store)
        for name, ctl in (("egress", egress),
                          ("sync", _SyncController(BucketSync(src_store, dst_store,
                                                              DATA_PREFIX))),
                          ("ingress", ingress)):
            ctl.start()
            running = _Running(name, ctl)
            running.thread.start()
            self._running.append(running)
        self.say("egress, bucket sync and ingress running; producing the sample …")

        producer = threading.Thread(target=self._produce, args=(eg_settings,),
                                    name="demo-producer", daemon=True)
        r.stages["produce"].started = r.stages["egress"].started = \
            r.stages["ingress"].started = time.monotonic()
        producer.start()
        deadline = time.monotonic() + o.timeout
        compaction_due = o.compaction
        while True:
            now = time.monotonic()
            self._check_threads()
            if now > deadline:
                raise TimeoutError(f"the pipeline did not finish within {o.timeout:.0f}s")
            produced_all = not producer.is_alive()
            if produced_all and r.stages["produce"].finished is None:
                producer.join()
                r.stages["produce"].finished = now
                if r.produced.errors:
                    raise RuntimeError("producing failed: " + "; ".join(r.produced.errors[:3]))
            segmented = self._segmented(src_store)
            replayed = self._replayed(ingress)
            self._show(now, segmented, replayed)
            target = r.produced.last_offsets if produced_all else None
            if target is not None and r.stages["egress"].finished is None \
                    and self._complete(segmented, target):
                r.stages["egress"].finished = now
            if target is not None and r.stages["ingress"].finished is None \
                    and self._complete(replayed, target):
                r.stages["ingress"].finished = now
            if compaction_due and r.stages["egress"].finished is not None:
                compaction_due = False
                self._compact(stack, src_store)
            if r.stages["ingress"].finished is not None and not compaction_due and \
                    self._synced(src_store, dst_store):
                break
            time.sleep(PROGRESS_INTERVAL)
        self.status("")
        self.say("every record replayed; stopping controllers")
        for running in reversed(self._running):
            running.stop()
        self._running.clear()
        self.say("verifying the copy record by record …")
        r.verify = verify_topics(eg_settings.kafka, r.topic, in_settings.kafka,
                                 r.destination_topic)
        if o.compaction:
            self._archive_query(stack, src_store)

    def _produce(self, settings: Settings) -> None:
        o = self.o

        def progress(n: int) -> None:
            self._produced = n

        self.result.produced = produce_sample(
            settings.kafka, self.result.topic,
            sample_records(o.records, o.partitions, seed=o.seed, value_size=o.value_size),
            on_progress=progress)

    def _check_threads(self) -> None:
        for running in self._running:
            if running.error is not None:
                raise RuntimeError(f"{running.name} stopped: {running.error}")
            if not running.thread.is_alive():
                raise RuntimeError(f"{running.name} stopped unexpectedly")

    def _segmented(self, store: ObjectStore) -> dict[int, int]:
        """Partition -> records covered by durable segments (segments touch from 0)."""
        out: dict[int, int] = {}
        for info in store.list(topic_prefix(DATA_PREFIX, SOURCE_REGION, self.result.topic)):
            k = SegmentKey.try_parse(info.key)
            if k is not None:
                out[k.partition] = max(out.get(k.partition, 0), k.end + 1)
        return out

    def _replayed(self, ingress: Any) -> dict[int, int]:
        out: dict[int, int] = {}
        for (_region, topic, partition), pos in ingress.positions().items():
            if topic == self.result.topic and pos is not None:
                out[partition] = pos + 1
        return out

    @staticmethod
    def _complete(done: dict[int, int], last_offsets: dict[int, int]) -> bool:
        return all(done.get(p, 0) >= last + 1 for p, last in last_offsets.items())

    def _levels(self, store: ObjectStore, region: str) -> dict[int, int]:
        counts: dict[int, int] = {}
        for info in store.list(topic_prefix(DATA_PREFIX, region, self.result.topic)):
            k = SegmentKey.try_parse(info.key)
            if k is not None:
                counts[k.level] = counts.get(k.level, 0) + 1
        return counts

    def _synced(self, src: ObjectStore, dst: ObjectStore) -> bool:
        prefix = topic_prefix(DATA_PREFIX, SOURCE_REGION, self.result.topic)
        return [o.key for o in src.list(prefix)] == [o.key for o in dst.list(prefix)]

    def _compact(self, stack: LocalStack, store: ObjectStore) -> None:
        from compaction.controller import Compaction

        r = self.result
        self.status("")
        r.segments_before = self._levels(store, SOURCE_REGION)
        self.say(f"all records are in {sum(r.segments_before.values())} level-0 segments; "
                 "running one compaction pass on Spark (local[2]) …")
        time.sleep(1.0)  # min_segment_age of the demo's compaction settings
        stage = r.stages["compaction"]
        stage.started = time.monotonic()
        settings = self._settings(stack, "compaction")
        compaction = Compaction(settings, store=store, serve_metrics=False,
                                archive_factory=_archive_factory)
        try:
            report = compaction.run_once()
        finally:
            compaction.close()
        stage.finished = time.monotonic()
        r.compaction_outcome = report.outcome if report.tasks else "nothing to merge"
        r.segments_after = self._levels(store, SOURCE_REGION)
        if report.outcome != "success":
            r.errors.append(f"compaction {report.outcome}: {report.reason}")
        self.say(f"  compaction {report.outcome} in {stage.seconds or 0:.1f}s: segments "
                 f"{levels_text(r.segments_before)} → {levels_text(r.segments_after)}")

    def _show(self, now: float, segmented: dict[int, int], replayed: dict[int, int]) -> None:
        r = self.result
        t0 = r.stages["produce"].started or now
        el = max(now - t0, 1e-9)
        seg, rep = sum(segmented.values()), sum(replayed.values())
        self.status(f"  {el:6.1f}s  produced {self._produced:>10,} ({self._produced / el:>9,.0f}/s)"
                    f" | segmented {seg:>10,} | replayed {rep:>10,} of {self.o.records:,}")
