"""Client configuration: our defaults, the user's ``kafka.config``, call-site overrides."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from replicator.core.batch_limits import DEFAULT_CLIENT_MAX
from replicator.core.settings import KafkaSettings

# Defaults that correctness depends on (``kafka.config`` and call-site overrides come after).
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,           # offsets are committed only after durability
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",       # a new group starts from the oldest record
    "isolation.level": "read_committed",   # never replicate open/aborted transactions
    # Eager range assignment; cooperative-sticky also works when set in kafka.config
    # (tests/integration/test_kafka_group_members.py runs both on Apache Kafka).
    "partition.assignment.strategy": "range",
    # When the prefetch queue is full (queued.max.messages.kbytes), librdkafka postpones
    # the partition's next fetch by this long; its default (1000 ms) idles a consumer that
    # does real work per record for most of each second once it drained the queue
    # (egress measured 120 MB/s with it, 190 MB/s with 10 ms).
    "fetch.queue.backoff.ms": 10,
}
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # Records of up to the source's max.message.bytes must pass the client's own check.
    "message.max.bytes": DEFAULT_CLIENT_MAX,
}

# ``kafka.config`` is shared by every client of a process, but librdkafka warns (CONFWARN)
# about consumer-only settings given to a producer or admin client and the reverse. These
# are dropped from the clients they do not apply to; everything else passes through.
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "session.timeout.ms", "heartbeat.interval.ms",
    "group.protocol", "group.protocol.type", "group.remote.assignor",
    "partition.assignment.strategy", "coordinator.query.interval.ms",
    "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms",
    "enable.auto.offset.store", "queued.min.messages", "queued.max.messages.kbytes",
    "fetch.wait.max.ms", "fetch.queue.backoff.ms", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes",
    "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof", "check.crcs",
    "auto.offset.reset", "allow.auto.create.topics",
})
PRODUCER_ONLY = frozenset({
    "transactional.id", "transaction.timeout.ms", "enable.idempotence",
    "enable.gapless.guarantee", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "queue.buffering.max.ms", "linger.ms", "message.send.max.retries", "retries",
    "compression.codec", "compression.type", "compression.level", "batch.num.messages",
    "batch.size", "delivery.report.only.error", "sticky.partitioning.linger.ms",
    "acks", "request.required.acks", "request.timeout.ms", "message.timeout.ms",
    "delivery.timeout.ms", "partitioner", "queuing.strategy",
})


class RepeatsToDebug(logging.Filter):
    """Keeps the first of each client log line at its level and sends its repeats within
    ``window`` seconds to DEBUG (dropped unless the logger is enabled for DEBUG).

    librdkafka logs a connection failure once per broker, client and retry: against a port
    where nothing listens, about 5 lines a second per client ("FAIL ... Connection
    refused"), which buried the one line that says what is wrong. Lines count as repeats
    when they differ only in the client's name (``rdkafka#consumer-2``), its thread and the
    ``(after Nms in state X)`` timing; a line still true after ``window`` is logged at its
    level again, so a lasting failure shows once a minute.
    """

    _VARYING = re.compile(r"\[rdkafka#[^\]]*\]|\[thrd:[^\]]*\]|\(after \d+ms in state \w+\)")

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_lines: int = 1024) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self.max_lines = max_lines
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        key = self._VARYING.sub("", record.getMessage())
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is None or now - last >= self.window:
                if len(self._last) >= self.max_lines:
                    self._last.clear()   # bounded: at worst a line is logged again
                self._last[key] = now
                return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


class TransportToWarning(logging.Filter):
    """Logs the client's transport failures at WARNING instead of ERROR, unless every
    broker is down.

    librdkafka logs each failed connection to one broker at ERROR (``Connect to ... failed:
    Connection refused``, ``Disconnected``, ``_TRANSPORT``, a receive timeout). On a
    cluster of several nodes one node down is routine (a restart, a rolling upgrade): the
    client goes on with the others, and an ERROR would read as an outage. Only
    ``_ALL_BROKERS_DOWN`` (``3/3 brokers are down``) stays an ERROR; any other line
    is left as it is.
    """

    _TRANSPORT = re.compile(
        r"Connect to \S+ failed|Connection refused|Disconnected|_TRANSPORT|"
        r"[Tt]ransport failure|Receive failed|Send failed|Connection reset|"
        r"Timed out \d+ in-flight|Broken pipe|_RESOLVE|Failed to resolve")
    _ALL_DOWN = re.compile(r"_ALL_BROKERS_DOWN|\b(\d+)/\1 brokers are down|"
                           r"[Aa]ll broker connections are down")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        text = record.getMessage()
        if self._TRANSPORT.search(text) and not self._ALL_DOWN.search(text):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


CLIENT_LOG = logging.getLogger("librdkafka")
"""Where the clients' own log lines go (the ``logger`` setting of every client the seam
builds): through Python logging, so each entry point decides where they appear, instead of
librdkafka writing to the process's stderr. Repeated lines go to DEBUG
(``RepeatsToDebug``); one broker's transport failures go to WARNING
(``TransportToWarning``)."""
CLIENT_LOG.addFilter(TransportToWarning())
CLIENT_LOG.addFilter(RepeatsToDebug())


def client_config(kafka: KafkaSettings, defaults: Mapping[str, Any],
                  overrides: Mapping[str, Any] | None = None, *,
                  drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Merge defaults, the user's ``kafka.config`` (less ``drop``) and call-site overrides."""
    conf: dict[str, Any] = {"bootstrap.servers": kafka.brokers}
    conf.update(defaults)
    conf.update({k: v for k, v in kafka.config.items() if k not in drop})
    conf.update(overrides or {})
    return conf
