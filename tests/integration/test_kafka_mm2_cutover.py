"""Cutover from Apache Kafka's MirrorMaker 2 to the replicator, on Apache Kafka
(docs/migrating-from-mirrormaker.md): records are produced throughout; MM2 copies them into
``primary.<topic>`` while egress archives the source; MM2 is stopped mid-stream;
``replicator cutover from-mm2`` writes ingress's checkpoints; ingress continues into the same
topic. MM2 is killed (SIGKILL): its own stored offsets may lag behind what it wrote, which
the cutover does not use. The destination is then the source record for record
(read_committed: no gap, no duplicate), and a group MM2 synced resumes at exactly the right
record after the cutover, both at an offset MM2 copied and at one ingress copied. Then the
rollback: ingress stops while records flow, its checkpoints become MM2's stored offsets,
and MM2 started again continues with no gap and no duplicate.

Cost: one MirrorMaker 2 JVM, started twice; 130 s measured at a load average of 9-11 on
2 cores (the rollback 34 s of it; 92-133 s before it at load averages of 12-24), most of it
MM2's start-ups and first copies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from egress.controller import Egress
from replicator.cli.main import main
from replicator.core.errors import ReplicatorError
from replicator.core.kafka import Admin, Consumer, Producer, TopicPartition, read_to_end
from replicator.core.keys import SegmentKey, topic_prefix
from replicator.core.settings import KafkaSettings
from replicator.ops.groups import SYNCED, TO_SYNC
from replicator.ops.verify import read_partition, verify_topics
from tests.conftest import unique_name
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_kafka_failover import _plan

pytestmark = pytest.mark.apache

PARTITIONS = 2
ALIAS = "primary"
Rec = tuple[bytes | None, bytes | None]


def _mm2_properties(pipe: Pipeline, group: str) -> str:
    """bench/peer_lib.py's ``mm2_properties`` (one flow, the default replication policy:
    the copy is ``primary.<topic>``), plus group offset sync of ``group`` every second."""
    return "\n".join([
        f"clusters = {ALIAS}, dr",
        f"{ALIAS}.bootstrap.servers = {pipe.source_brokers}",
        f"dr.bootstrap.servers = {pipe.dest_brokers}",
        f"{ALIAS}->dr.enabled = true",
        f"{ALIAS}->dr.topics = {pipe.topic.replace('.', '[.]')}",
        f"dr->{ALIAS}.enabled = false",
        f"{ALIAS}->dr.groups = {group}",
        f"{ALIAS}->dr.sync.group.offsets.enabled = true",
        f"{ALIAS}->dr.sync.group.offsets.interval.seconds = 1",
        f"{ALIAS}->dr.emit.checkpoints.interval.seconds = 1",
        "refresh.topics.interval.seconds = 1",
        "refresh.groups.interval.seconds = 1",
        "emit.heartbeats.enabled = false",
        "sync.topic.acls.enabled = false",
        "offset.flush.interval.ms = 1000",
        "tasks.max = 1",
        "plugin.discovery = service_load",
        "replication.factor = 1",
        "checkpoints.topic.replication.factor = 1",
        "heartbeats.topic.replication.factor = 1",
        "offset-syncs.topic.replication.factor = 1",
        "offset.storage.replication.factor = 1",
        "status.storage.replication.factor = 1",
        "config.storage.replication.factor = 1",
        "dr.producer.acks = all",
    ]) + "\n"


@contextmanager
def _mirrormaker(pipe: Pipeline, group: str, work: Path) -> Iterator[subprocess.Popen[bytes]]:
    kafka_home = Path(os.environ["KAFKA_HOME"])
    props = work / "mm2.properties"
    props.write_text(_mm2_properties(pipe, group))
    env = {**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m", "KAFKA_JMX_OPTS": " ",
           "LOG_DIR": str(work / "mm2-logs")}
    with open(work / "mm2.log", "wb") as out:
        proc = subprocess.Popen([str(kafka_home / "bin" / "connect-mirror-maker.sh"),
                                 str(props)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        yield proc
    except BaseException:
        lines = (work / "mm2.log").read_text(errors="replace").splitlines()
        print("\n".join(lines[-60:]))
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Trickle:
    """Distinct records into every partition of the source until stopped."""

    def __init__(self, pipe: Pipeline, first: int = 0) -> None:
        self.pipe = pipe
        self.stopping = threading.Event()
        self.sent = first
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = Producer(self.pipe.source_kafka)
        while not self.stopping.is_set():
            for p in range(PARTITIONS):
                n = self.sent
                producer.produce(self.pipe.topic, f"value-{n}".encode(), f"k{n}".encode(),
                                 partition=p, headers=[("seq", str(n).encode())])
                self.sent += 1
            producer.flush(10)
            self.stopping.wait(0.02)
        producer.flush(30)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)


def _ends(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    """The partitions' ends; -1 while the broker cannot say yet (a topic MM2 just created
    answers UNKNOWN_LEADER_EPOCH for a moment)."""
    try:
        ends = Admin(kafka).log_ends([(topic, p) for p in range(PARTITIONS)], timeout=10)
    except ReplicatorError:
        return {p: -1 for p in range(PARTITIONS)}
    return {p: o for (_, p), o in ends.items()}


def _archived_to(pipe: Pipeline) -> dict[int, int]:
    """The last source offset egress's segments reach, per partition."""
    out = {p: -1 for p in range(PARTITIONS)}
    for info in pipe.store.list(topic_prefix("data", "us-east-1", pipe.topic)):
        k = SegmentKey.try_parse(info.key)
        if k is not None:
            out[k.partition] = max(out[k.partition], k.end)
    return out


MM2_OFFSETS = f"mm2-offsets.{ALIAS}.internal"


def _mm2_offset_records(pipe: Pipeline) -> dict[int, list[tuple[bytes, int, int]]]:
    """Per source partition, MM2's stored records in its Connect offsets topic (in the
    target cluster: what a rollback to MM2 rewrites, docs/migrating-from-mirrormaker.md):
    each record's key as stored, the offsets topic's partition it is in, and the source
    offset, in the order read (one offsets-topic partition's records in their order)."""
    out: dict[int, list[tuple[bytes, int, int]]] = {}
    for m in read_to_end(pipe.dest_kafka, MM2_OFFSETS, timeout=30):
        raw, value = m.key() or b"null", m.value()
        key = json.loads(raw)
        if isinstance(key, list) and key[0] == "MirrorSourceConnector" and value:
            part = key[1]
            if part.get("topic") == pipe.topic:
                out.setdefault(int(part["partition"]), []).append(
                    (raw, m.partition() or 0, int(json.loads(value)["offset"])))
    return out


def _mm2_source_offsets(pipe: Pipeline) -> dict[int, int]:
    """The last source offset MM2 stored per partition."""
    return {p: recs[-1][2] for p, recs in _mm2_offset_records(pipe).items()}


def _mm2_offset_key(topic: str, partition: int) -> bytes:
    """The key MM2 stores a source partition's offset under (docs/migrating-from-mirrormaker.md,
    "Rollback to MirrorMaker 2"): Connect's JSON, no spaces."""
    return json.dumps(["MirrorSourceConnector",
                       {"cluster": ALIAS, "partition": partition, "topic": topic}],
                      separators=(",", ":")).encode()


def _config(pipe: Pipeline, tmp_path: Path) -> Path:
    return pipe.ingress_config_file(tmp_path, destination_topic=f"{ALIAS}.{{topic}}",
                                    checkpoint_topic=pipe.checkpoint_topic)


def _first_read(pipe: Pipeline, group: str, dest: str) -> dict[int, Rec]:
    """The first record a consumer of ``group`` reads in ``dest``, per partition."""
    committed = Admin(pipe.dest_kafka).group_offsets(group)
    consumer = Consumer(pipe.dest_kafka, unique_name("reader"))
    consumer.assign([TopicPartition(dest, p, committed[(dest, p)]) for p in range(PARTITIONS)])
    out: dict[int, Rec] = {}
    try:
        def done() -> bool:
            for (_, p), msgs in consumer.fetch(100, 0.2).runs.items():
                out.setdefault(p, (msgs[0].key(), msgs[0].value()))
            return len(out) == PARTITIONS
        wait_for(done, 30, "the group's first records")
    finally:
        consumer.close()
    return out


def _record_at(kafka: KafkaSettings, topic: str, partition: int, offset: int) -> Rec:
    consumer = Consumer(kafka, unique_name("reader"))
    consumer.assign([TopicPartition(topic, partition, offset)])
    found: list[Rec] = []
    try:
        def read() -> bool:
            for msgs in consumer.fetch(1, 0.2).runs.values():
                found.append((msgs[0].key(), msgs[0].value()))
            return bool(found)
        wait_for(read, 30, f"{topic}[{partition}] at {offset}")
    finally:
        consumer.close()
    return found[0]


def _source_records(pipe: Pipeline) -> dict[int, dict[int, Rec]]:
    return {p: {m.offset() or 0: (m.key(), m.value())
                for m in read_partition(pipe.source_kafka, pipe.topic, p)}
            for p in range(PARTITIONS)}


def test_ingress_continues_where_mirrormaker_2_stopped(pipe: Pipeline, tmp_path: Path) -> None:
    pipe.create_source(PARTITIONS)
    dest = f"{ALIAS}.{pipe.topic}"
    group = unique_name("app")
    source_admin, dest_admin = Admin(pipe.source_kafka), Admin(pipe.dest_kafka)
    ingress_settings = pipe.ingress_settings(sources=[{
        "region": "us-east-1", "topic": pipe.topic, "destination_topic": f"{ALIAS}.{{topic}}",
        "lost_segment_timeout": "60s", "first_segment_delay": "2s"}])
    egress = Egress(pipe.egress_settings(max_segment_messages=50,
                                         egress={"group_export": {"interval": "1s"}}),
                    store=pipe.store)

    with Trickle(pipe) as trickle, running_egress(egress):
        wait_for(lambda: min(_ends(pipe.source_kafka, pipe.topic).values()) >= 40, 30,
                 "the first source records")
        # A group of the source, committed where MM2 will have copied.
        mm2_part = {p: 17 + p for p in range(PARTITIONS)}
        source_admin.alter_group_offsets(group, {(pipe.topic, p): o
                                                 for p, o in mm2_part.items()})
        with _mirrormaker(pipe, group, tmp_path) as mm2:
            wait_for(lambda: dest in dest_admin.list_topics()
                     and min(_ends(pipe.dest_kafka, dest).values()) >= 40, 120,
                     "MirrorMaker 2 copying")
            wait_for(lambda: len(dest_admin.group_offsets(group)) == PARTITIONS, 40,
                     "MirrorMaker 2 syncing the group into the destination")
            # A cutover while MM2 still writes is refused: MM2's newest copies are not
            # archived yet, or (had egress caught up) the destination grew during the
            # command (tests/unit/test_cli_cutover.py).
            early = CliRunner().invoke(main, ["cutover", "from-mm2", "--config",
                                              str(_config(pipe, tmp_path))])
            assert early.exit_code == 1 and ("egress has not archived" in early.output
                                             or "destination grew" in early.output), \
                early.output
            # Killed mid-stream (the harder stop: its last source offsets may not be
            # committed, and records it wrote after them are in the destination); the
            # source goes on.
            os.killpg(mm2.pid, signal.SIGKILL)
            assert mm2.wait(60) is not None
        copied_by_mm2 = _ends(pipe.dest_kafka, dest)
        stopped_at = _ends(pipe.source_kafka, pipe.topic)
        wait_for(lambda: all(_archived_to(pipe)[p] >= stopped_at[p] - 1
                             for p in range(PARTITIONS)), 30, "egress archiving past MM2")

        result = CliRunner().invoke(main, ["cutover", "from-mm2", "--config",
                                           str(_config(pipe, tmp_path)), "--output", "json"])
        assert result.exit_code == 0, result.output
        plan = {c["partition"]: c for c in json.loads(result.output)["partitions"]}
        mm2_stored = _mm2_source_offsets(pipe)
        for p in range(PARTITIONS):
            assert plan[p]["destination_end"] == copied_by_mm2[p]
            assert plan[p]["aligned_records"] == copied_by_mm2[p]     # egress from the start
            # MM2's own stored offset is at or behind what it really wrote (it is
            # equal after a graceful stop): the cutover never relies on it.
            assert plan[p]["resume_at"] >= mm2_stored.get(p, -1) + 1, (plan[p], mm2_stored)
        # Run again: refused, ingress's checkpoints exist.
        again = CliRunner().invoke(main, ["cutover", "from-mm2", "--config",
                                          str(_config(pipe, tmp_path))])
        assert again.exit_code == 1 and "already has checkpoints" in again.output

        with ExitStack() as rolling_back:
            with running_ingress(ingress_settings) as ing:
                wait_for(lambda: min(_ends(pipe.dest_kafka, dest).values())
                         > max(copied_by_mm2.values()) + 25, 60, "ingress copying")
                trickle.stop()
                reports = []

                def copied() -> bool:
                    reports.append(verify_topics(pipe.source_kafka, pipe.topic, pipe.dest_kafka,
                                                 dest))
                    totals = reports[-1].totals()
                    return totals["destination_records"] >= totals["source_records"]
                wait_for(copied, 60, "the destination to reach the source's end")
                assert reports[-1].ok, report_text(reports[-1])

                # The group MM2 synced: translated exactly through the cutover's map entries.
                source = _source_records(pipe)
                wait_for(lambda: {r.state for r in _plan(pipe, ingress_settings)
                                  if r.group == group} <= {TO_SYNC, SYNCED}, 30,
                         "the group's translation")
                CliRunner().invoke(main, ["groups", "sync", "--config",
                                          str(_config(pipe, tmp_path))], catch_exceptions=False)
                first = _first_read(pipe, group, dest)
                assert first == {p: source[p][o] for p, o in mm2_part.items()}

                # Later, past the cutover: the group committed in ingress's part.
                after = {p: copied_by_mm2[p] + 20 for p in range(PARTITIONS)}
                source_admin.alter_group_offsets(group, {(pipe.topic, p): o
                                                         for p, o in after.items()})
                wait_for(lambda: all(r.source_committed == after[r.partition]
                                     for r in _plan(pipe, ingress_settings) if r.group == group),
                         30, "the new export")
                CliRunner().invoke(main, ["groups", "sync", "--config",
                                          str(_config(pipe, tmp_path))], catch_exceptions=False)
                assert _first_read(pipe, group, dest) == {p: source[p][o]
                                                           for p, o in after.items()}

                # The rollback: records flow again, and ingress stops while they do.
                rollback = rolling_back.enter_context(Trickle(pipe, first=trickle.sent))
                ends = _ends(pipe.source_kafka, pipe.topic)
                wait_for(lambda: all(pipe.checkpoint_offsets(ing).get(p, -1) >= ends[p] + 5
                                     for p in range(PARTITIONS)), 60,
                         "ingress copying the new records")
            _roll_back_to_mirrormaker_2(pipe, group, tmp_path, dest, rollback)


def _roll_back_to_mirrormaker_2(pipe: Pipeline, group: str, tmp_path: Path, dest: str,
                                trickle: Trickle) -> None:
    """docs/migrating-from-mirrormaker.md, "Rollback to MirrorMaker 2", as written: with
    ingress stopped (records still produced), its checkpoints from ``checkpoints show``
    become MM2's stored source offsets (the same keys, into the partitions they are in),
    and MM2 started again continues after ingress's last record: the destination is the
    source with no gap and no duplicate."""
    shown = CliRunner().invoke(main, ["checkpoints", "show", "--config",
                                      str(_config(pipe, tmp_path)), "--output", "json"])
    assert shown.exit_code == 0, shown.output
    checkpoints = {r["partition"]: r["checkpoint"]
                   for r in json.loads(shown.output[shown.output.index("["):])}
    # The known point: the destination ends with the checkpoint's source record (the
    # source is read at that offset only: it keeps growing).
    for p in range(PARTITIONS):
        (last,) = list(read_partition(pipe.dest_kafka, dest, p))[-1:]
        assert (last.key(), last.value()) == _record_at(pipe.source_kafka, pipe.topic, p,
                                                        checkpoints[p]), p
    # MM2 was killed before it stored any offset (a graceful stop stores them): the keys
    # are written as the documentation gives them, with the console producer's partitioner
    # (murmur2), so they land where MM2 writes them.
    stored = _mm2_offset_records(pipe)
    producer = Producer(KafkaSettings(brokers=pipe.dest_brokers,
                                      config={"partitioner": "murmur2_random"}))
    for p in range(PARTITIONS):
        key = stored[p][-1][0] if p in stored else _mm2_offset_key(pipe.topic, p)
        producer.produce(MM2_OFFSETS, json.dumps({"offset": checkpoints[p]}).encode(), key)
    assert producer.flush(30) == 0
    written = _mm2_offset_records(pipe)
    assert {p: recs[-1][2] for p, recs in written.items()} == checkpoints
    work = tmp_path / "rollback"
    work.mkdir()
    with _mirrormaker(pipe, group, work) as mm2:
        resumed = _ends(pipe.dest_kafka, dest)
        wait_for(lambda: all(e > resumed[p] + 10
                             for p, e in _ends(pipe.dest_kafka, dest).items()), 120,
                 "MirrorMaker 2 copying again")
        trickle.stop()
        reports = []

        def copied() -> bool:
            reports.append(verify_topics(pipe.source_kafka, pipe.topic, pipe.dest_kafka,
                                         dest))
            totals = reports[-1].totals()
            return totals["destination_records"] >= totals["source_records"]
        wait_for(copied, 60, "MirrorMaker 2 to reach the source's end")
        assert reports[-1].ok, report_text(reports[-1])
        # Stopped gracefully, MM2 stores its offsets: under exactly the keys and in exactly
        # the partitions written above (else a later restart could read the rollback's
        # value after MM2's newer one).
        os.killpg(mm2.pid, signal.SIGTERM)
        mm2.wait(60)
    for p, recs in _mm2_offset_records(pipe).items():
        assert {(key, partition) for key, partition, _ in recs} == {written[p][-1][:2]}, recs
        assert recs[-1][2] > checkpoints[p], recs
