"""SQS checks of ``replicator doctor``: ingress's queue exists and answers, and its
visibility timeout leaves the relay time to publish a message's events before the message
comes back.

``queue_check`` and ``visibility_check`` are pure; ``sqs_checks`` reads the queue through
the SQS seam (``QueueProbe`` here).
"""

from __future__ import annotations

from typing import Protocol

from replicator.core.errors import ObjectNotFound, ReplicatorError, StorageError
from replicator.ops.doctor.report import Check, fail, passed, warn

QUEUE = "sqs queue"

MIN_VISIBILITY_SECONDS = 30
"""The relay deletes a message after publishing its events to the segment-events topic,
which may take up to the publish timeout (30 s); a message visible again before that is
received twice (harmless, events are de-duplicated, but it doubles the work)."""
RECOMMENDED_VISIBILITY_SECONDS = 60
"""What deploy/aws/setup-region.sh sets."""


class QueueProbe(Protocol):
    """What the SQS checks read (``replicator.core.sqs.SqsQueue``)."""

    name: str

    @property
    def arn(self) -> str: ...
    def attributes(self) -> dict[str, str]: ...


def queue_check(queue: str, attributes: dict[str, str] | None,
                error: ReplicatorError | None) -> Check:
    """PASS when the queue's attributes were read; FAIL naming why not."""
    if error is None and attributes is not None:
        waiting = attributes.get("ApproximateNumberOfMessages", "?")
        redrive = "a redrive policy" if attributes.get("RedrivePolicy") else "no redrive policy"
        return passed(QUEUE, f"{queue}: {waiting} message(s) waiting, {redrive}")
    if isinstance(error, ObjectNotFound):
        return fail(QUEUE, f"{queue} does not exist",
                    "create the queue and the bucket's notification to it "
                    "(deploy/aws/setup-region.sh), or fix ingress.sqs_queue")
    if isinstance(error, StorageError):
        return fail(QUEUE, f"no answer: {error}",
                    "check ingress.sqs_endpoint_url and the network path to SQS")
    return fail(QUEUE, f"refused: {error}",
                "grant sqs:GetQueueUrl, GetQueueAttributes, ReceiveMessage, DeleteMessage "
                "on the queue (docs/deploy.md, IAM)")


def visibility_check(attributes: dict[str, str]) -> Check:
    """WARN when the visibility timeout is shorter than the relay's publish timeout."""
    name = "sqs visibility timeout"
    value = attributes.get("VisibilityTimeout")
    if value is None or not value.isdigit():
        return warn(name, "not reported", f"set VisibilityTimeout={RECOMMENDED_VISIBILITY_SECONDS}")
    if int(value) < MIN_VISIBILITY_SECONDS:
        return warn(name, f"{value}s",
                    f"set VisibilityTimeout={RECOMMENDED_VISIBILITY_SECONDS}: a message comes "
                    f"back after {value}s, possibly while its events are still being "
                    f"published (up to {MIN_VISIBILITY_SECONDS}s), and is handled twice")
    return passed(name, f"{value}s")


def sqs_checks(queue: QueueProbe) -> tuple[list[Check], str | None]:
    """The queue's checks, and its ARN (``None`` when it could not be read)."""
    try:
        attributes = queue.attributes()
    except ReplicatorError as e:
        return [queue_check(queue.name, None, e)], None
    arn = attributes.get("QueueArn") or queue.arn
    return [queue_check(queue.name, attributes, None), visibility_check(attributes)], arn
