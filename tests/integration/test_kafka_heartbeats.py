"""Egress heartbeats across the real boundaries, on Apache Kafka and moto: egress reads the
consumer's position and cached high watermark, writes the heartbeat object to S3; the
running ingress lists it, exports its age, and a partition replayed up to the heartbeat's
position is fresh as of the heartbeat, not as of its (old) records.
"""

from __future__ import annotations

import time

import pytest

from egress.controller import Egress
from replicator.core.heartbeats import read_heartbeats
from replicator.core.kafka import Producer
from tests.integration.pipeline import (
    SOURCE_REGION,
    Pipeline,
    running_egress,
    running_ingress,
    wait_for,
)

pytestmark = pytest.mark.apache

PARTITIONS = 2
OLD_MS = int(time.time() * 1000) - 3 * 3600 * 1000   # records 3 hours old (retention: 7 days)


def test_heartbeats_tell_a_quiet_topic_from_a_stopped_replication(pipe: Pipeline) -> None:
    pipe.create_source(PARTITIONS)
    p = Producer(pipe.source_kafka)
    for i in range(20):
        p.produce(pipe.topic, value=f"v{i}".encode(), partition=i % PARTITIONS,
                  timestamp=OLD_MS + i)
    assert p.flush(30) == 0
    egress = Egress(pipe.egress_settings(max_segment_messages=10, heartbeat_interval="1s"),
                    store=pipe.store)
    with running_egress(egress), running_ingress(pipe.ingress_settings()) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing) == {0: 9, 1: 9}, 90,
                 "every record replayed")

        def caught_up() -> bool:
            beats = read_heartbeats(pipe.store, "data", SOURCE_REGION, pipe.topic)
            return any(hb.caught_up == {0: 9, 1: 9} for hb in beats)

        wait_for(caught_up, 60, "a heartbeat listing both partitions at their ends")

        def fresh() -> bool:
            lags = [ing.metrics.value("replicator_ingress_replication_lag_seconds",
                                      {"region": SOURCE_REGION, "topic": pipe.topic,
                                       "partition": str(part)}) for part in range(PARTITIONS)]
            return all(lag is not None and lag < 600 for lag in lags)

        # The records are 3 hours old: only the heartbeat brings the lag under 10 minutes.
        wait_for(fresh, 60, "the lag measured from the heartbeat")
        age = ing.metrics.value("replicator_ingress_heartbeat_age_seconds",
                                {"region": SOURCE_REGION, "topic": pipe.topic})
        assert age is not None and age < 600
