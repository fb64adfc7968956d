"""What a replay worker (``ingress.worker``) is configured with, and its timing constants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ingress.delivery import Delivery
from ingress.limits import DestinationLimits
from ingress.rows import Header
from replicator.core.keys import PartitionRef
from replicator.core.retry import Backoff
from replicator.core.settings import IngressSourceSettings


def session_backoff() -> Backoff:
    """Restart delays after a failed replay session: short first (a broker blip), capped so
    a persistent failure (a missing topic) is retried about once a minute, never in a hot
    loop.
    """
    return Backoff(initial=timedelta(milliseconds=500), multiplier=2.0,
                   maximum=timedelta(seconds=60), jitter=0.2)


def refusal_backoff() -> Backoff:
    """Retry delays of a partition stopped at a record its destination refuses: slow (the
    refusal passes only once someone changes the destination: a changed topic config
    retries at once, ``ReplayWorker.retry_refused``).
    """
    return Backoff(initial=timedelta(seconds=10), multiplier=2.0,
                   maximum=timedelta(minutes=5), jitter=0.2)


FENCED_STALL = 3
"""Fencings in a row, without a checkpoint in between, after which a partition is reported
stalled (it keeps retrying)."""

STOP_POLL = 0.1
"""Seconds between checks of a stopping worker's batch in flight (committed, or never
committable once its partition is revoked)."""


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs besides its seams.

    ``delivery`` is the protocol the controller chose for the process
    (``ingress.delivery.delivery_for``).
    """

    source: IngressSourceSettings
    ref: PartitionRef
    destination_topic: str
    delivery: type[Delivery]
    batch_size: int
    rescan_interval: timedelta
    batch_bytes: int = 4 * 1024**2
    origin: Header | None = None
    """The origin marker appended to every replayed record (``[ingress] mark_origin``)."""
    limits: DestinationLimits | None = None
    """The destination's and the client's record limits: a record either may refuse is
    replayed alone (``ingress.limits.isolate``); ``None``: only a record refused before is."""
