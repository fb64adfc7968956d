"""The SQS seam — the only module that talks to SQS through boto3.

Ingress polls the queue that receives the destination bucket's S3 event notifications
(``SqsQueue.receive`` with long polling), and deletes messages only after their events are
published. botocore errors are translated with ``replicator.core.aws.translate``: a missing
queue is ``ObjectNotFound``, throttling/5xx/timeouts are ``StorageError`` (retriable),
anything else ``StorageFatalError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3

from replicator.core.aws import aws_errors, client_config

if TYPE_CHECKING:
    from replicator.core.settings import Settings

log = logging.getLogger(__name__)

#: ReceiveMessage and DeleteMessageBatch take at most 10 messages.
MAX_BATCH = 10
#: The longest long poll SQS allows.
MAX_WAIT_SECONDS = 20


def make_sqs_client(*, endpoint_url: str | None, region: str, access_key_id: str | None,
                    secret_access_key: str | None, max_pool_connections: int = 32,
                    connect_timeout: float = 5.0, read_timeout: float = 60.0,
                    max_attempts: int = 3) -> Any:
    """A boto3 SQS client (read timeout above the 20 s long poll)."""
    session = boto3.session.Session(
        aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
        region_name=region)
    return session.client(
        "sqs", endpoint_url=endpoint_url,
        config=client_config(max_pool_connections=max_pool_connections,
                             connect_timeout=connect_timeout,
                             read_timeout=max(read_timeout, MAX_WAIT_SECONDS + 10),
                             max_attempts=max_attempts))


@dataclass(frozen=True)
class QueueMessage:
    """One received SQS message.

    ``receive_count`` is SQS's ApproximateReceiveCount (1 on the first delivery).
    """

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int


class SqsQueue:
    """One SQS queue, by name or URL. The URL of a name is resolved on first use.

    Raises (every method):
        ObjectNotFound: the queue does not exist.
        StorageError: throttling, 5xx, timeouts (retriable).
        StorageFatalError: anything else (access denied, invalid parameters).
    """

    def __init__(self, client: Any, queue: str) -> None:
        self.client = client
        self.queue = queue
        is_url = queue.startswith(("http://", "https://"))
        self.name = queue.rstrip("/").rsplit("/", 1)[-1] if is_url else queue
        self._url: str | None = queue if is_url else None
        self._arn: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SqsQueue:
        """The queue of ``[ingress]`` in ``settings.region``.

        The endpoint is ``ingress.sqs_endpoint_url``, else ``s3.endpoint_url`` (an
        S3-compatible stack usually serves both); static keys are those of ``[s3]``.
        """
        ingress = settings.require("ingress")
        s3 = settings.s3
        key, secret = s3.static_keys()
        client = make_sqs_client(
            endpoint_url=ingress.sqs_endpoint_url or s3.endpoint_url, region=settings.region,
            access_key_id=key, secret_access_key=secret)
        return cls(client, ingress.sqs_queue)

    def __repr__(self) -> str:
        return f"SqsQueue({self.name})"

    @property
    def url(self) -> str:
        """The queue URL (resolved with GetQueueUrl the first time).

        Raises:
            ObjectNotFound: no queue of that name.
        """
        with self._lock:
            if self._url is None:
                with aws_errors(f"get url of SQS queue {self.name}"):
                    self._url = str(self.client.get_queue_url(QueueName=self.name)["QueueUrl"])
            return self._url

    @property
    def arn(self) -> str:
        """The queue ARN (for bucket notification configurations)."""
        if self._arn is None:
            url = self.url
            with aws_errors(f"get ARN of SQS queue {self.name}"):
                attrs = self.client.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
            self._arn = str(attrs["QueueArn"])
        return self._arn

    def attributes(self) -> dict[str, str]:
        """Every attribute of the queue (``VisibilityTimeout``, ``RedrivePolicy``, ...)."""
        url = self.url
        with aws_errors(f"get attributes of SQS queue {self.name}"):
            attrs = self.client.get_queue_attributes(
                QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})
        return {str(k): str(v) for k, v in attrs.items()}

    def receive(self, max_messages: int = 10, wait_seconds: int = 20,
                visibility_timeout: int | None = None) -> list[QueueMessage]:
        """Long-poll for up to ``max_messages`` (at most 10) messages.

        Returns an empty list when nothing arrived within ``wait_seconds`` (at most 20).
        """
        args: dict[str, Any] = {
            "QueueUrl": self.url,
            "MaxNumberOfMessages": max(1, min(max_messages, MAX_BATCH)),
            "WaitTimeSeconds": max(0, min(wait_seconds, MAX_WAIT_SECONDS)),
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if visibility_timeout is not None:
            args["VisibilityTimeout"] = visibility_timeout
        with aws_errors(f"receive from SQS queue {self.name}"):
            resp = self.client.receive_message(**args)
        return [
            QueueMessage(
                message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"],
                body=m.get("Body", ""),
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)))
            for m in resp.get("Messages", [])
        ]

    def delete(self, messages: Sequence[QueueMessage]) -> list[str]:
        """Delete messages (batches of 10); return the ids SQS refused, after logging them.

        A refused message (e.g. its receipt handle expired) becomes visible again and is
        received a second time; consumers de-duplicate events.
        """
        failed: list[str] = []
        url = self.url
        for i in range(0, len(messages), MAX_BATCH):
            batch = messages[i:i + MAX_BATCH]
            entries = [{"Id": str(n), "ReceiptHandle": m.receipt_handle}
                       for n, m in enumerate(batch)]
            with aws_errors(f"delete {len(batch)} messages from SQS queue {self.name}"):
                resp = self.client.delete_message_batch(QueueUrl=url, Entries=entries)
            for f in resp.get("Failed", []):
                msg = batch[int(f["Id"])]
                failed.append(msg.message_id)
                log.warning("SQS queue %s refused to delete message %s: %s %s", self.name,
                            msg.message_id, f.get("Code", "?"), f.get("Message", ""))
        return failed

    def change_visibility(self, message: QueueMessage, seconds: int) -> None:
        """Hide ``message`` for ``seconds`` more (0 makes it visible again at once)."""
        with aws_errors(f"change visibility of message {message.message_id} in SQS queue "
                        f"{self.name}"):
            self.client.change_message_visibility(
                QueueUrl=self.url, ReceiptHandle=message.receipt_handle,
                VisibilityTimeout=seconds)
