"""A LogAppendTime source topic, on Apache Kafka: timestamps carried as documented.

The source broker stamps each record with its own append time (whatever the producer
set). Egress keeps that time and the type in the segment (``timestamp_type`` =
LogAppendTime); ingress replays the broker's time as the copy's CreateTime, and does not
copy ``message.timestamp.type`` to the destination topic, whose broker would otherwise
stamp its own, later time over it (ingress/README.md, ``ingress/topics.py``). Tansu
ignores LogAppendTime, so this needs ``KAFKA_HOME``.
"""

from __future__ import annotations

import pytest

from egress.controller import Egress
from formats.base import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from replicator.core.kafka import Admin, Producer
from replicator.ops.verify import read_partition
from tests.conftest import RECENT_MS
from tests.integration.pipeline import (
    Pipeline,
    report_text,
    running_egress,
    running_ingress,
    wait_for,
)
from tests.integration.test_egress import read_partition as read_segments
from tests.integration.test_ingress import read_topic

pytestmark = pytest.mark.apache


def test_log_append_time_source_keeps_the_broker_time(pipe: Pipeline) -> None:
    pipe.create_source(1, {"message.timestamp.type": "LogAppendTime"})
    p = Producer(pipe.source_kafka)
    producer_ts = RECENT_MS - 86_400_000  # a day older than anything the broker stamps
    for i in range(120):
        p.produce(pipe.topic, value=f"v{i}".encode(), partition=0, timestamp=producer_ts + i)
    assert p.flush(30) == 0
    source = [m.timestamp() for m in read_partition(pipe.source_kafka, pipe.topic, 0)]
    assert {t for t, _ in source} == {TIMESTAMP_LOG_APPEND_TIME}
    broker_times = [ts for _, ts in source]
    assert min(broker_times) > producer_ts + 1000  # the broker's clock, not the producer's

    with running_egress(Egress(pipe.egress_settings(max_segment_messages=50),
                               store=pipe.store)), \
            running_ingress(pipe.ingress_settings()) as ing:
        wait_for(lambda: pipe.checkpoint_offsets(ing).get(0) == 119, 60, "the replay")
    segments = read_segments(pipe.store, pipe.topic, 0)
    assert [(r.timestamp_ms, r.timestamp_type) for r in segments] == \
        [(ts, TIMESTAMP_LOG_APPEND_TIME) for ts in broker_times]
    copy = read_topic(pipe.dest_brokers, pipe.dest_topic)[0]
    assert [(row[4], row[5]) for row in copy] == \
        [(ts, TIMESTAMP_CREATE_TIME) for ts in broker_times]
    assert "message.timestamp.type" not in Admin(pipe.dest_kafka).topic_config(pipe.dest_topic)
    report = pipe.verify()  # keys, values, headers and timestamps
    assert report.ok, report_text(report)
