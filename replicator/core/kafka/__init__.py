"""The Kafka seam: the only package that imports ``confluent_kafka``.

Services talk to three typed wrappers and never see a client exception or error code:

* ``Producer`` (``producer.py``): full local queue, delivery reports per partition,
  transactions as explicit steps with translated errors;
* ``Consumer`` (``consumer.py``): fetch sorted into records / errors / partition ends,
  typed rebalance callbacks, eager and incremental assignment, commit/seek/pause;
* ``Admin`` (``admin.py``): topics and their configs, the cluster and its brokers;

plus ``read_to_end`` (``reader.py``: a topic from the beginning to its end). Client errors
become the suite's error tree in ``errors.py`` (docs/architecture.md, "Errors").
"""

from __future__ import annotations

from replicator.core.kafka.admin import Admin, ClusterInfo
from replicator.core.kafka.config import (
    CONSUMER_DEFAULTS,
    CONSUMER_ONLY,
    PRODUCER_DEFAULTS,
    PRODUCER_ONLY,
    client_config,
)
from replicator.core.kafka.consumer import (
    Consumer,
    RebalanceCallback,
    group_generation,
    group_id_of,
)
from replicator.core.kafka.producer import GroupMetadata, Producer
from replicator.core.kafka.reader import read_to_end
from replicator.core.kafka.types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    DeliveryReport,
    Fetched,
    Headers,
    Message,
    TopicPartition,
)

__all__ = [
    "CONSUMER_DEFAULTS",
    "CONSUMER_ONLY",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "PRODUCER_DEFAULTS",
    "PRODUCER_ONLY",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "Admin",
    "ClusterInfo",
    "Consumer",
    "DeliveryReport",
    "Fetched",
    "GroupMetadata",
    "Headers",
    "Message",
    "Producer",
    "RebalanceCallback",
    "TopicPartition",
    "client_config",
    "group_generation",
    "group_id_of",
    "read_to_end",
]
