"""``send_offsets_to_transaction`` with a deadline (exactly-once ingress, step 5 of a
transaction; ``ingress.transactions``).

librdkafka (2.16) may never return from that call when the group coordinator moved: its
coordinator-request timeout is not enforced, and a coordinator node that shut down cleanly
leaves the cluster's metadata, so the client drops that broker but keeps it cached as the
group's coordinator and waits for it to come up; it never asks for the new coordinator
(seen in every rolling restart of a three-node cluster whose clean shutdown moved the
placement group's coordinator). The call runs on its own thread; past ``PROBE_AFTER``
seconds a fresh client asks the group's coordinator (``coordinator_answers``): once a
coordinator answered, the call has ``SETTLE`` more seconds and is then given up as stuck
(``StaleCoordinator``), about 15 s after the move instead of the 70 s it took before.
Without an answer (the coordinator still moving or loading: a wait that ends by itself)
the call has ``timeout + SEND_OFFSETS_GRACE`` seconds; then ``OffsetsHung``. Either way
the caller abandons the producer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import Producer, TopicPartition

SEND_OFFSETS_GRACE = 10.0
"""Seconds beyond its own timeout ``send_offsets_to_transaction`` may take before the
producer is abandoned."""

PROBE_AFTER = 5.0
"""Seconds the call may take before the group's coordinator is asked about (a healthy
call takes milliseconds; a coordinator moving takes a few seconds to find)."""

PROBE_EVERY = 2.0
"""Seconds between two questions while no coordinator answers."""

SETTLE = 10.0
"""Seconds the call may still take once a coordinator answered another client: a client
that is not stuck looks for the coordinator again at its cached broker's next reconnect
attempt, at most ``reconnect.backoff.max.ms`` (10 s by default) later."""


class OffsetsHung(KafkaRetriableError):
    """``send_offsets_to_transaction`` did not return within its timeout plus
    ``SEND_OFFSETS_GRACE``: the producer is abandoned (never aborted: that call would wait
    behind the hung one) and recreated; its open transaction is aborted by the new
    producer's ``init_transactions`` (same ``transactional.id``).
    """


class StaleCoordinator(OffsetsHung):
    """The call did not return ``SETTLE`` seconds after the group's coordinator answered
    another client: the producer waits for a coordinator that left (a clean shutdown,
    librdkafka's stale coordinator cache). Abandoned and recreated like ``OffsetsHung``;
    an expected step of a rolling restart, so a WARNING, not an ERROR.
    """


def send_offsets_within(p: Producer, offsets: Sequence[TopicPartition], meta: Any,
                        timeout: float, *, name: str, transactional_id: str,
                        coordinator_answers: Callable[[], bool] | None = None) -> None:
    """``p.send_offsets_to_transaction(offsets, meta, timeout)``, given up once it is stuck.

    ``coordinator_answers`` says whether the placement group's coordinator answers a fresh
    client now (asked after ``PROBE_AFTER`` seconds, then every ``PROBE_EVERY``); without
    it only the long deadline applies.

    Raises:
        StaleCoordinator: a coordinator answered but the call did not return ``SETTLE``
            seconds later (it may still be running).
        OffsetsHung: the call did not return within ``timeout + SEND_OFFSETS_GRACE``.
        ReplicatorError: what the call raised.
    """
    done = threading.Event()
    failed: list[BaseException] = []

    def call() -> None:
        try:
            p.send_offsets_to_transaction(list(offsets), meta, timeout)
        except Exception as e:  # noqa: BLE001 - raised again on the caller's thread
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=call, name=f"{name}-offsets", daemon=True).start()
    limit = timeout + SEND_OFFSETS_GRACE
    if not _wait(done, limit, coordinator_answers, transactional_id):
        raise OffsetsHung(f"transactions of {transactional_id}: sending the placement "
                          f"group's offsets to the transaction did not return within "
                          f"{limit:g}s (the group coordinator moved and the client never "
                          f"found the new one); the producer is abandoned and recreated")
    if failed:
        raise failed[0]


def _wait(done: threading.Event, limit: float, coordinator_answers: Callable[[], bool] | None,
          transactional_id: str) -> bool:
    """True once ``done`` is set within ``limit``; False past it.

    Raises:
        StaleCoordinator: see ``send_offsets_within``.
    """
    start = time.monotonic()
    if coordinator_answers is None:
        return done.wait(limit)
    if done.wait(min(PROBE_AFTER, limit)):
        return True
    while True:
        left = limit - (time.monotonic() - start)
        if left <= 0:
            return False
        if _answers(coordinator_answers):
            if done.wait(min(SETTLE, left)):
                return True
            if time.monotonic() - start >= limit:
                return False
            raise StaleCoordinator(
                f"transactions of {transactional_id}: sending the placement group's "
                f"offsets to the transaction did not return {SETTLE:g}s after the group's "
                f"coordinator answered another client ({time.monotonic() - start:.0f}s in "
                f"all: the client still waits for the coordinator that left, as in a "
                f"rolling restart); the producer is abandoned and recreated")
        if done.wait(min(PROBE_EVERY, max(left, 0.0))):
            return True


def _answers(coordinator_answers: Callable[[], bool]) -> bool:
    try:
        return coordinator_answers()
    except Exception:  # noqa: BLE001 - a probe that fails is a coordinator not answering
        return False
