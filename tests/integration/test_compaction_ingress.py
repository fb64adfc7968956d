"""Ingress replaying a partition while compaction merges and deletes its level-0 segments:
the destination still receives every record exactly once, in order (Tansu + moto S3/SQS)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from compaction.controller import Compaction
from replicator.core.settings import load_settings
from tests.integration.test_ingress import (  # the ingress harness: bucket, queue, topics
    SOURCE_REGION,
    Env,
    count,
    env,
    expected_rows,
    read_topic,
    rich_record,
    running,
    wait_for,
)

__all__ = ["env"]   # the fixture, re-exported so pytest finds it here


def compaction_for(e: Env) -> Compaction:
    data = json.loads(json.dumps(e.data))
    data["region"] = SOURCE_REGION   # compaction runs in the region that owns the segments
    del data["ingress"]
    # One bucket that nothing replicates (moto reports no replication status).
    data["compaction"] = {"spark_master": "inline", "parallelism": 2,
                          "replication_grace": "0s", "topics": {
        e.source: {"min_segment_age": "1h", "min_segment_count": 2, "min_segment_size": 1,
                   "max_segment_count": 1000, "batch_size": 1000}}}
    settings = load_settings(data=data, environ={})
    return Compaction(settings, store=e.store, serve_metrics=False,
                      clock=lambda: datetime.now(UTC) + timedelta(hours=2))


def test_ingress_receives_every_record_once_while_compaction_deletes_level0(env: Env) -> None:
    env.write_meta(2)
    width, first_half, total = 100, 10, 20
    for p in (0, 1):
        for i in range(first_half):
            env.write(env.segment_key(p, i * width, i * width + width - 1))
    with running(env.settings()) as ing:
        wait_for(lambda: count(env.brokers, env.dest) >= 1, 40, "ingress to start replaying")
        # The rest arrives while ingress works; compaction then merges all 20 level-0
        # segments of each partition into one level-1 segment and deletes them, racing
        # ingress's reads and the queued events of the deleted keys.
        for p in (0, 1):
            for i in range(first_half, total):
                env.write(env.segment_key(p, i * width, i * width + width - 1))
        c = compaction_for(env)
        report = c.run_once()
        c.close()
        assert report.outcome == "success", report
        assert sorted(t.output for t in report.tasks) == [
            env.segment_key(p, 0, total * width - 1, level=1).to_key() for p in (0, 1)]
        wait_for(lambda: count(env.brokers, env.dest) >= 2 * total * width, 60,
                 "every record in the destination")
        assert ing.metrics.total("replicator_ingress_segments_lost_total") == 0

    got = read_topic(env.brokers, env.dest)
    for p in (0, 1):
        assert got[p] == expected_rows(p, [rich_record(p, o) for o in range(total * width)])
    level0 = [i.key for i in env.store.list(f"data/{SOURCE_REGION}/{env.source}/0/0/")]
    assert level0 == []
