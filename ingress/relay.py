"""SQS → segment-events topic relay.

S3 sends object events to the SQS queue. The relay receives them (long polling), turns
them into segment events, publishes those to the segment-events topic and only then
deletes the SQS messages. Nothing local is updated here: workers learn about segments
from the events topic only, so an event whose publication failed is received again from
SQS (after its visibility timeout) instead of being half-applied (the original updated
local state first and dropped the event when the publish failed).

Malformed messages: a body that can never be parsed would otherwise come back forever.
It is logged at ERROR with its body (first 2000 characters), counted in
``replicator_ingress_sqs_events_invalid_total{reason}`` and deleted. Records that are valid
but not ours (test event, other bucket/prefix/source, non-segment keys) are counted in
``replicator_ingress_sqs_events_ignored_total{reason}`` and deleted with their message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Container, Sequence
from typing import Any, Protocol

from ingress.events import EventDeduper, SegmentEvent, parse_s3_message
from ingress.metrics import IngressMetrics
from ingress.segment_events import SegmentEvents
from replicator.core.errors import FatalError, RetriableError
from replicator.core.retry import Backoff

log = logging.getLogger(__name__)

BODY_LOG_LIMIT = 2000


def relay_backoff() -> Backoff:
    """Waits after a failed receive/publish/delete: from 200 ms, growing to 10 s so an outage
    is not hammered.
    """
    return Backoff(multiplier=2.0, jitter=0.2)


class QueueMessageLike(Protocol):
    """What the relay reads of a received message (``replicator.core.sqs.QueueMessage``)."""

    @property
    def message_id(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def receive_count(self) -> int: ...


class EventQueue(Protocol):
    """The SQS seam the relay needs (``replicator.core.sqs.SqsQueue``)."""

    def receive(self, max_messages: int = 10, wait_seconds: int = 20) -> Sequence[
            QueueMessageLike]: ...
    def delete(self, messages: Sequence[Any]) -> list[str]: ...


class SqsRelay:
    """Moves S3 events from SQS to the segment-events topic."""

    def __init__(self, queue: EventQueue, events: SegmentEvents, metrics: IngressMetrics, *,
                 bucket: str, prefix: str, sources: Container[tuple[str, str]],
                 max_messages: int = 10, wait_seconds: int = 20) -> None:
        self.queue = queue
        self.events = events
        self.metrics = metrics
        self.bucket = bucket
        self.prefix = prefix
        # Not copied: a SourceFilter follows the topics discovered while running.
        self.sources = sources
        self.max_messages = max_messages
        self.wait_seconds = wait_seconds
        self.deduper = EventDeduper()

    def run_once(self) -> int:
        """Relay one batch of messages; returns the number of events published.

        1. Receive up to ``max_messages`` messages (long poll).
        2. Parse them: count ignored and invalid records (log invalid bodies at ERROR);
           drop repeats of already published events.
        3. Publish the events and wait until the broker acknowledged every one.
        4. Only then delete the messages from the queue.
        5. Remember the published events for de-duplication.

        Raises:
            RetriableError: receive, publish or delete failed; nothing was deleted unless
                it was published.
        """
        # Step 1
        messages = self.queue.receive(self.max_messages, self.wait_seconds)
        if not messages:
            return 0
        self.metrics.sqs_received.inc(len(messages))
        # Step 2
        found: list[SegmentEvent] = []
        for m in messages:
            parsed = parse_s3_message(m.body, bucket=self.bucket, prefix=self.prefix,
                                      sources=self.sources)
            for reason, what in parsed.ignored:
                log.debug("ignoring S3 event (%s): %s", reason, what)
                self.metrics.sqs_ignored.labels(reason=reason).inc()
            for reason in parsed.invalid:
                self.metrics.sqs_invalid.labels(reason=reason).inc()
            if parsed.invalid:
                log.error("SQS message %s (received %d time(s)) is not a valid S3 event "
                          "notification (%s); deleting it. Body: %s", m.message_id,
                          m.receive_count, ", ".join(parsed.invalid), m.body[:BODY_LOG_LIMIT])
            for ev in parsed.events:
                self.metrics.sqs_events.labels(kind=ev.kind).inc()
            found.extend(parsed.events)
        fresh = self.deduper.fresh(found)
        # Step 3
        self.events.publish(fresh)
        for ev in fresh:
            log.debug("published segment event %s %s", ev.kind, ev.key)
        # Step 4
        refused = self.queue.delete(messages)
        if refused:
            log.warning("%d SQS message(s) could not be deleted and will be received again "
                        "(their events are de-duplicated)", len(refused))
        # Step 5
        self.deduper.remember(fresh)
        return len(fresh)

    def run(self, stopping: threading.Event, sleep: Callable[[float], bool] | None = None
            ) -> None:
        """Relay until ``stopping`` is set; failures wait with backoff and retry."""
        wait = sleep or stopping.wait
        backoff = relay_backoff()
        while not stopping.is_set():
            try:
                self.run_once()
                backoff.reset()
            except (RetriableError, FatalError) as e:
                delay = backoff.next()
                log.error("SQS relay failed, retrying in %.1fs: %s", delay, e)
                wait(delay)
