"""``send_offsets_to_transaction`` with a deadline (exactly-once ingress, step 5 of a
transaction; ``ingress.transactions``).

librdkafka may never return from that call when the group coordinator moved: its
coordinator-request timeout is not enforced (seen on a three-node cluster's rolling
restart: ingress waited in silence until it was stopped). The call runs on its own thread
and is waited for ``timeout + SEND_OFFSETS_GRACE`` seconds; past that ``OffsetsHung`` is
raised and the caller abandons the producer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from replicator.core.errors import KafkaRetriableError
from replicator.core.kafka import Producer, TopicPartition

SEND_OFFSETS_GRACE = 10.0
"""Seconds beyond its own timeout ``send_offsets_to_transaction`` may take before the
producer is abandoned."""


class OffsetsHung(KafkaRetriableError):
    """``send_offsets_to_transaction`` did not return within its timeout plus
    ``SEND_OFFSETS_GRACE``: the producer is abandoned (never aborted: that call would wait
    behind the hung one) and recreated; its open transaction is aborted by the new
    producer's ``init_transactions`` (same ``transactional.id``).
    """


def send_offsets_within(p: Producer, offsets: Sequence[TopicPartition], meta: Any,
                        timeout: float, *, name: str, transactional_id: str) -> None:
    """``p.send_offsets_to_transaction(offsets, meta, timeout)``, given up after
    ``timeout + SEND_OFFSETS_GRACE`` seconds.

    Raises:
        OffsetsHung: the call did not return in time (it may still be running).
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
    if not done.wait(limit):
        raise OffsetsHung(f"transactions of {transactional_id}: sending the placement "
                          f"group's offsets to the transaction did not return within "
                          f"{limit:g}s (the group coordinator moved and the client never "
                          f"found the new one); the producer is abandoned and recreated")
    if failed:
        raise failed[0]
