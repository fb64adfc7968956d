"""What the embedded stack offers (regions, buckets, queue, topic, credentials) and the
TOML config of each controller on it (``render_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from replicator.devstack.toml_writer import toml_value

Role = Literal["egress", "ingress", "compaction"]
ROLES: tuple[Role, ...] = ("egress", "ingress", "compaction")

SOURCE_REGION = "us-east-1"
DEST_REGION = "us-west-1"
SOURCE_BUCKET = "source-bucket"
DEST_BUCKET = "destination-bucket"
QUEUE = "destination-bucket-events-queue"
TOPIC = "sensor.events"
PARTITIONS = 4
ACCESS_KEY = "test"  # moto accepts any static credentials
SECRET_KEY = "test"  # moto placeholder, not a secret
DATA_PREFIX = "data"
TEMP_PREFIX = "temp"


# Short group timeouts: a consumer's first assignment waits about session.timeout.ms / 2 on
# Tansu, so the librdkafka default of 45 s would make every start wait 23 s (docs/testing.md);
# on Apache Kafka a killed member holds its partitions for session.timeout.ms.
FAST_GROUP_CONFIG: dict[str, int | str] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
    # Eager assignment: Tansu leaves partitions unowned for seconds per cooperative
    # rebalance (docs/testing.md); production egress defaults to cooperative-sticky.
    "partition.assignment.strategy": "range",
}

def render_config(role: Role, endpoints: Mapping[str, str], *, topic: str = TOPIC,
                  metrics_port: int = 0) -> str:
    """The TOML config of one controller on the local stack (keys: docs/configuration.md).

    Thresholds are small so a demo sees segments within seconds: segments close after 2 s,
    ingress waits seconds (not the production hour) for late segments, and compaction
    merges any two segments older than 10 s, every minute.
    """
    region = DEST_REGION if role == "ingress" else SOURCE_REGION
    bucket = DEST_BUCKET if role == "ingress" else SOURCE_BUCKET
    brokers = endpoints["destination_kafka" if role == "ingress" else "source_kafka"]
    head = f"""# Written by `replicator local up` for the embedded stack; {role} in {region}.
# Any value can be overridden with REPLICATOR_<SECTION>__<KEY> environment variables.
region = {toml_value(region)}

[s3]
bucket = {toml_value(bucket)}
prefix = {toml_value(DATA_PREFIX)}
temp_prefix = {toml_value(TEMP_PREFIX)}
endpoint_url = {toml_value(endpoints["s3"])}
access_key_id = {toml_value(ACCESS_KEY)}
secret_access_key = {toml_value(SECRET_KEY)}

[kafka]
brokers = {toml_value(brokers)}
# Short group timeouts: joins and rebalances take seconds, not the librdkafka defaults.
config = {toml_value(FAST_GROUP_CONFIG)}

[format]
name = "parquet"
compression = "zstd"

[metrics]
host = "127.0.0.1"
port = {metrics_port}

[log]
level = "INFO"
"""
    if role == "egress":
        body = f"""
[egress]
group_id = "replicator.egress"

[egress.topics.{toml_value(topic)}]
max_segment_messages = 10000
max_segment_size = "1MiB"
max_segment_age = "2s"
"""
    elif role == "ingress":
        body = f"""
[ingress]
group_id = "replicator.ingress"
sqs_queue = {toml_value(QUEUE)}
sqs_endpoint_url = {toml_value(endpoints["sqs"])}
segment_events_topic = "replicator.segmentevents"
segment_events_retention = "1h"
checkpoint_topic = "replicator.checkpoint"
delivery = "exactly-once"

[[ingress.sources]]
region = {toml_value(SOURCE_REGION)}
topic = {toml_value(topic)}
destination_topic = {toml_value(topic + ".copy")}
lost_segment_timeout = "30s"
late_segment_retries = 3
first_segment_delay = "2s"
"""
    else:
        body = f"""
[compaction]
schedule = "* * * * *"
# The embedded stack copies its buckets with `replicator sync` every half second (no S3
# replication status): inputs may go as soon as their output is written; a late output
# in the other bucket is a late segment that ingress waits for.
replication_grace = "0s"
parallelism = 2
spark_master = "local[2]"
spark_conf = {{ "spark.ui.enabled" = "false", "spark.driver.host" = "127.0.0.1" }}

[compaction.topics.{toml_value(topic)}]
min_level = 0
max_level = 0
min_segment_age = "10s"
min_segment_count = 2
min_segment_size = 1
max_segment_count = 1000
max_segment_size = "1GiB"
batch_size = 10000
delete = true
"""
    return head + body
