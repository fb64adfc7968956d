"""What the S3 and SQS seams share: the botocore client configuration and the translation
of botocore errors into the suite's error tree (the only place that reads an AWS error
code).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

from replicator.core.errors import (
    ConditionalConflict,
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
    StorageFatalError,
)

#: Error codes that name a missing object, bucket or queue.
NOT_FOUND_CODES = frozenset({
    "NoSuchKey", "404", "NotFound", "NoSuchBucket",
    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist",
})
#: Error codes of a failed precondition (conditional create lost the race).
PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
#: Error codes worth trying again: throttling, timeouts, and S3's "try again" answers.
RETRIABLE_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "RequestLimitExceeded", "TooManyRequestsException",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "OperationAborted",
    "PriorRequestNotComplete", "EC2ThrottledException", "ConditionalRequestConflict",
    "AWS.SimpleQueueService.RequestThrottled", "KMS.ThrottlingException", "503", "500",
})


# --- errors --------------------------------------------------------------------------


def error_code(e: ClientError) -> str:
    """The AWS error code of a ``ClientError`` ("" when absent)."""
    return str(e.response.get("Error", {}).get("Code", ""))


def http_status(e: ClientError) -> int:
    """The HTTP status of a ``ClientError`` (0 when absent)."""
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def translate(e: BaseException, what: str) -> ReplicatorError:
    """Sort a botocore error into the suite's error tree (the caller raises it ``from e``).

    ``what`` names the request and its target, e.g. ``"get s3://bucket/key"``.

    * missing object/bucket/queue (NoSuchKey, 404, NoSuchBucket, NonExistentQueue) →
      ``ObjectNotFound``;
    * 412 / PreconditionFailed → ``PreconditionFailed``;
    * 409 ConditionalRequestConflict → ``ConditionalConflict`` (a retriable
      ``StorageError``);
    * 5xx, throttling (SlowDown, Throttling, ...), RequestTimeout, connection and read
      timeouts → ``StorageError`` (retriable);
    * anything else (access denied, invalid request, missing credentials) →
      ``StorageFatalError``.
    """
    if isinstance(e, ReplicatorError):
        return e
    if isinstance(e, ClientError):
        code, status = error_code(e), http_status(e)
        msg = e.response.get("Error", {}).get("Message") or str(e)
        text = f"{what}: {code or status} {msg}".rstrip()
        if code in NOT_FOUND_CODES or (status == 404 and code != "NoSuchUpload"):
            return ObjectNotFound(f"{what}: does not exist ({code or status})")
        if code in PRECONDITION_CODES or status == 412:
            return PreconditionFailed(f"{what}: precondition failed ({code or status})")
        if code == "ConditionalRequestConflict":
            return ConditionalConflict(text)
        if code in RETRIABLE_CODES or status >= 500 or status == 429:
            return StorageError(text)
        return StorageFatalError(text)
    if isinstance(e, BotoConnectionError | HTTPClientError | IncompleteReadError):
        # Endpoint unreachable, connect/read timeouts, connection reset mid-body.
        return StorageError(f"{what}: {type(e).__name__}: {e}")
    if isinstance(e, BotoCoreError):
        return StorageFatalError(f"{what}: {type(e).__name__}: {e}")
    return StorageFatalError(f"{what}: {type(e).__name__}: {e}")


@contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Translate botocore errors raised inside the block (``raise ... from e``)."""
    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise translate(e, what) from e


# --- client configuration ------------------------------------------------------------


def client_config(*, max_pool_connections: int = 32, connect_timeout: float = 5.0,
                  read_timeout: float = 60.0, max_attempts: int = 3,
                  addressing_style: str | None = None) -> Config:
    """The botocore ``Config`` shared by S3 and SQS clients.

    ``read_timeout`` must exceed the SQS long-poll wait (at most 20 s). botocore's
    "standard" retry mode retries throttling and 5xx with jittered backoff within one call;
    the suite's own ``RetryPolicy`` retries whole operations above that.
    """
    s3_opts: dict[str, Any] = {}
    if addressing_style:
        s3_opts["addressing_style"] = addressing_style
    return Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        tcp_keepalive=True,
        s3=cast(Any, s3_opts or None),
    )
