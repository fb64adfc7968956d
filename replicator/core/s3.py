"""The S3 implementation of ``ObjectStore`` — the only module that talks to S3 through boto3.

Everything S3-specific stays here: client construction (timeouts, retries, connection pool),
multipart streaming uploads, multipart server-side copy above 5 GiB, conditional create
(``If-None-Match: *``), paginated listing, batched deletes, server-side encryption, and the
translation of botocore errors into the suite's error tree (``translate``), which
``replicator.core.sqs`` reuses. Bucket administration used by the embedded stack and the
tests (``create_bucket``, ``set_bucket_notifications``, ``set_lifecycle_for_temp``) lives
here too, so no other module needs boto3.
"""

from __future__ import annotations

import builtins
import logging
import math
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

from replicator.core.errors import (
    ObjectNotFound,
    PreconditionFailed,
    ReplicatorError,
    StorageError,
    StorageFatalError,
)
from replicator.core.storage import STANDARD, ObjectInfo, ObjectStore, Upload

if TYPE_CHECKING:
    from replicator.core.settings import Settings

log = logging.getLogger(__name__)

MiB = 1024**2
GiB = 1024**3

#: S3 refuses parts below 5 MiB (except the last) and above 5 GiB, and more than 10 000 parts.
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000
#: DeleteObjects takes at most 1000 keys per request.
DELETE_BATCH = 1000

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


# --- client --------------------------------------------------------------------------


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


def make_s3_client(*, endpoint_url: str | None, region: str, access_key_id: str | None,
                   secret_access_key: str | None, max_pool_connections: int = 32,
                   connect_timeout: float = 5.0, read_timeout: float = 60.0,
                   max_attempts: int = 3, addressing_style: str | None = None) -> Any:
    """A boto3 S3 client; static keys when given, otherwise the AWS credential chain."""
    session = boto3.session.Session(
        aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
        region_name=region)
    return session.client(
        "s3", endpoint_url=endpoint_url,
        config=client_config(max_pool_connections=max_pool_connections,
                             connect_timeout=connect_timeout, read_timeout=read_timeout,
                             max_attempts=max_attempts, addressing_style=addressing_style))


def _etag(value: Any) -> str:
    return str(value or "").strip('"')


# --- the store -----------------------------------------------------------------------


class S3ObjectStore(ObjectStore):
    """``ObjectStore`` on one S3 bucket (or an S3-compatible store via ``endpoint_url``).

    Args:
        client: a boto3 S3 client (``make_s3_client``); thread-safe, shared by uploads.
        bucket: the bucket.
        part_size: multipart upload part size; an upload holds at most one part in memory.
            Objects smaller than one part are sent with a single PutObject.
        multipart_copy_threshold: objects larger than this are copied with UploadPartCopy
            (a single CopyObject is limited to 5 GiB).
        sse: ``"AES256"`` or ``"aws:kms"``, applied to every write (put, upload, copy).
        sse_kms_key_id: the KMS key when ``sse == "aws:kms"``.
        page_size: keys per ListObjectsV2 page (S3 caps it at 1000; smaller in tests).
        copy_concurrency: parallel UploadPartCopy requests of one multipart copy.
    """

    def __init__(self, client: Any, bucket: str, *, part_size: int = 8 * MiB,
                 multipart_copy_threshold: int = 5 * GiB, sse: str | None = None,
                 sse_kms_key_id: str | None = None, page_size: int = 1000,
                 copy_concurrency: int = 8) -> None:
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise StorageFatalError(f"part_size {part_size} outside S3's 5MiB..5GiB limits")
        if not 1 <= multipart_copy_threshold <= MAX_PART_SIZE:
            raise StorageFatalError(f"multipart_copy_threshold {multipart_copy_threshold} "
                                    "above 5GiB (the CopyObject limit)")
        self.client = client
        self.bucket = bucket
        self.part_size = part_size
        self.multipart_copy_threshold = multipart_copy_threshold
        self.sse = sse
        self.sse_kms_key_id = sse_kms_key_id
        self.page_size = max(1, min(page_size, 1000))
        self.copy_concurrency = max(1, copy_concurrency)

    @classmethod
    def from_settings(cls, settings: Settings) -> S3ObjectStore:
        """The store of ``settings.s3`` with a client for ``settings.s3_region``."""
        s3 = settings.s3
        client = make_s3_client(
            endpoint_url=s3.endpoint_url, region=settings.s3_region,
            access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
            secret_access_key=(s3.secret_access_key.get_secret_value()
                               if s3.secret_access_key else None),
            max_pool_connections=s3.max_pool_connections)
        return cls(client, s3.bucket, part_size=s3.part_size,
                   multipart_copy_threshold=s3.multipart_copy_threshold, sse=s3.sse,
                   sse_kms_key_id=s3.sse_kms_key_id)

    def __repr__(self) -> str:
        return f"S3ObjectStore(s3://{self.bucket})"

    # helpers ---------------------------------------------------------------------------

    def url(self, key: str) -> str:
        """``s3://bucket/key`` for messages."""
        return f"s3://{self.bucket}/{key}"

    def write_args(self, storage_class: str | None = None,
                   content_type: str | None = None) -> dict[str, Any]:
        """Parameters every write carries: storage class, content type, encryption."""
        args: dict[str, Any] = {}
        if storage_class:
            args["StorageClass"] = storage_class
        if content_type:
            args["ContentType"] = content_type
        if self.sse:
            args["ServerSideEncryption"] = self.sse
            if self.sse_kms_key_id:
                args["SSEKMSKeyId"] = self.sse_kms_key_id
        return args

    # ObjectStore -------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            storage_class: str | None = None, content_type: str | None = None) -> ObjectInfo:
        args = self.write_args(storage_class, content_type)
        if if_none_match:
            args["IfNoneMatch"] = "*"
        with aws_errors(f"put {self.url(key)}"):
            resp = self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(data), **args)
        return ObjectInfo(key, len(data), datetime.now(UTC), _etag(resp.get("ETag")),
                          storage_class or STANDARD)

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        return S3Upload(self, key, storage_class)

    def get(self, key: str) -> bytes:
        with aws_errors(f"get {self.url(key)}"):
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return bytes(resp["Body"].read())

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StorageFatalError(f"invalid range {start}+{length} for {self.url(key)}")
        if length == 0:
            self.head(key)  # still raises ObjectNotFound for a missing key
            return b""
        what = f"get {self.url(key)} bytes {start}..{start + length - 1}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key,
                                          Range=f"bytes={start}-{start + length - 1}")
            return bytes(resp["Body"].read())
        except ClientError as e:
            if error_code(e) == "InvalidRange" or http_status(e) == 416:
                # The object exists but ``start`` is at or past its end: the interface
                # returns fewer bytes (none) at the end of the object.
                return b""
            raise translate(e, what) from e
        except BotoCoreError as e:
            raise translate(e, what) from e

    def head(self, key: str) -> ObjectInfo:
        with aws_errors(f"head {self.url(key)}"):
            resp = self.client.head_object(Bucket=self.bucket, Key=key)
        return ObjectInfo(key, int(resp["ContentLength"]), resp["LastModified"],
                          _etag(resp.get("ETag")), resp.get("StorageClass") or STANDARD)

    def list(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                                "PaginationConfig": {"PageSize": self.page_size}}
        if start_after:
            args["StartAfter"] = start_after
        with aws_errors(f"list s3://{self.bucket}/{prefix}*"):
            for page in self.client.get_paginator("list_objects_v2").paginate(**args):
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"], int(item["Size"]), item["LastModified"],
                                     _etag(item.get("ETag")),
                                     item.get("StorageClass") or STANDARD)

    def copy(self, src: str, dst: str, *, storage_class: str | None = None) -> ObjectInfo:
        what = f"copy {self.url(src)} to {self.url(dst)}"
        with aws_errors(f"{what}: head source"):
            head = self.client.head_object(Bucket=self.bucket, Key=src)
        size = int(head["ContentLength"])
        if size <= self.multipart_copy_threshold:
            # MetadataDirective defaults to COPY: content type and user metadata are kept.
            with aws_errors(what):
                resp = self.client.copy_object(
                    Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src},
                    **self.write_args(storage_class))
            result = resp.get("CopyObjectResult", {})
            return ObjectInfo(dst, size, result.get("LastModified") or datetime.now(UTC),
                              _etag(result.get("ETag")), storage_class or STANDARD)
        return self._multipart_copy(src, dst, head, storage_class, what)

    def _multipart_copy(self, src: str, dst: str, head: dict[str, Any],
                        storage_class: str | None, what: str) -> ObjectInfo:
        """Copy ``src`` in UploadPartCopy ranges; abort the upload on any failure."""
        size = int(head["ContentLength"])
        part = max(self.part_size, math.ceil(size / MAX_PARTS))
        ranges = [(n + 1, off, min(off + part, size) - 1)
                  for n, off in enumerate(range(0, size, part))]
        args = self.write_args(storage_class, head.get("ContentType"))
        if head.get("Metadata"):
            args["Metadata"] = head["Metadata"]
        with aws_errors(f"{what}: create multipart upload"):
            upload_id = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=dst, **args)["UploadId"]
        source_etag = head.get("ETag")

        def copy_part(r: tuple[int, int, int]) -> dict[str, Any]:
            number, first, last = r
            with aws_errors(f"{what}: part {number} bytes {first}..{last}"):
                resp = self.client.upload_part_copy(
                    Bucket=self.bucket, Key=dst, UploadId=upload_id, PartNumber=number,
                    CopySource={"Bucket": self.bucket, "Key": src},
                    CopySourceRange=f"bytes={first}-{last}",
                    # Refuse (412) if the source changes under us mid-copy.
                    CopySourceIfMatch=source_etag)
            return {"PartNumber": number, "ETag": resp["CopyPartResult"]["ETag"]}

        try:
            with ThreadPoolExecutor(min(self.copy_concurrency, len(ranges)),
                                    thread_name_prefix="s3-copy") as pool:
                parts = list(pool.map(copy_part, ranges))
            with aws_errors(f"{what}: complete multipart upload"):
                resp = self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=dst, UploadId=upload_id,
                    MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort_quietly(dst, upload_id)
            raise
        log.debug("copied %s to %s in %d parts (%d bytes)", self.url(src), self.url(dst),
                  len(parts), size)
        return ObjectInfo(dst, size, datetime.now(UTC), _etag(resp.get("ETag")),
                          storage_class or STANDARD)

    def _abort_quietly(self, key: str, upload_id: str) -> None:
        """Abort after a failure without hiding the failure itself."""
        try:
            self.abort_multipart(key, upload_id)
        except ReplicatorError as e:
            # The lifecycle rule (set_lifecycle_for_temp) removes it after a day.
            log.warning("could not abort multipart upload %s of %s (left for the bucket "
                        "lifecycle rule): %s", upload_id, self.url(key), e)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort one multipart upload; an upload already gone is not an error."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            if error_code(e) == "NoSuchUpload" or http_status(e) == 404:
                return
            raise translate(e, f"abort upload {upload_id} of {self.url(key)}") from e
        except BotoCoreError as e:
            raise translate(e, f"abort upload {upload_id} of {self.url(key)}") from e

    def delete(self, key: str) -> None:
        with aws_errors(f"delete {self.url(key)}"):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    def delete_many(self, keys: Iterable[str]) -> None:
        failed: list[tuple[str, str]] = []
        batch: list[str] = []

        def flush() -> None:
            what = f"delete {len(batch)} keys in s3://{self.bucket} from {batch[0]}"
            with aws_errors(what):
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            failed.extend((err.get("Key", "?"), err.get("Code", "?"))
                          for err in resp.get("Errors", []))
            batch.clear()

        for key in keys:
            batch.append(key)
            if len(batch) == DELETE_BATCH:
                flush()
        if batch:
            flush()
        if failed:
            shown = ", ".join(f"{k} ({c})" for k, c in failed[:20])
            more = f" and {len(failed) - 20} more" if len(failed) > 20 else ""
            msg = (f"delete in s3://{self.bucket} refused for {len(failed)} key(s): "
                   f"{shown}{more}")
            if all(c in RETRIABLE_CODES for _, c in failed):
                raise StorageError(msg)
            raise StorageFatalError(msg)

    # test and operations helpers ---------------------------------------------------------

    def open_multipart_uploads(self, prefix: str = "") -> builtins.list[tuple[str, str]]:
        """``(key, upload_id)`` of multipart uploads not completed nor aborted."""
        out: builtins.list[tuple[str, str]] = []
        with aws_errors(f"list multipart uploads s3://{self.bucket}/{prefix}*"):
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=self.bucket, Prefix=prefix):
                out.extend((u["Key"], u["UploadId"]) for u in page.get("Uploads", []))
        return out


class S3Upload(Upload):
    """A streaming upload: parts of ``part_size`` are sent as they fill.

    Memory held is at most one part. The multipart upload is created with the first full
    part; an object that stays below one part is sent with one PutObject at ``complete``.
    A failed part send leaves the upload open but unusable: the caller must ``abort``.
    ``complete`` may be called again after a retriable failure; once it succeeded it
    returns the same ``ObjectInfo``. ``abort`` may raise ``StorageError`` when S3 cannot be
    reached (call it again, or leave it to the bucket's abort-incomplete-uploads rule).
    """

    def __init__(self, store: S3ObjectStore, key: str, storage_class: str | None) -> None:
        self.store = store
        self.key = key
        self.storage_class = storage_class
        self.upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._buf = bytearray()
        self._written = 0
        self._state = "open"  # open | failed | complete | aborted
        self._result: ObjectInfo | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Upload({self.store.url(self.key)}, {self._state}, {len(self._parts)} parts)"

    def _check_open(self, action: str) -> None:
        if self._state != "open":
            raise StorageFatalError(f"cannot {action} upload to {self.store.url(self.key)}: it "
                                    f"is {self._state}")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with self._lock:
            self._check_open("write to")
            view = memoryview(data).cast("B")
            total = len(view)
            part_size = self.store.part_size
            while view:
                # Fill the buffer up to one part only: memory stays bounded by part_size
                # whatever the caller's write size.
                take = min(len(view), part_size - len(self._buf))
                self._buf += view[:take]
                view = view[take:]
                self._written += take
                if len(self._buf) >= part_size:
                    try:
                        self._send_part()
                    except BaseException:
                        self._state = "failed"
                        raise
            return total

    def _send_part(self) -> None:
        """Send the buffer as the next part (creating the multipart upload first)."""
        s = self.store
        if self.upload_id is None:
            with aws_errors(f"create multipart upload {s.url(self.key)}"):
                self.upload_id = s.client.create_multipart_upload(
                    Bucket=s.bucket, Key=self.key,
                    **s.write_args(self.storage_class))["UploadId"]
        number = len(self._parts) + 1
        with aws_errors(f"upload part {number} of {s.url(self.key)}"):
            resp = s.client.upload_part(Bucket=s.bucket, Key=self.key, UploadId=self.upload_id,
                                        PartNumber=number, Body=bytes(self._buf))
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})
        self._buf.clear()

    def complete(self) -> ObjectInfo:
        with self._lock:
            if self._result is not None:
                return self._result
            self._check_open("complete")
            s = self.store
            if self.upload_id is None:
                # Below one part: a single PutObject is cheaper than a multipart upload.
                info = s.put(self.key, bytes(self._buf), storage_class=self.storage_class)
            else:
                if self._buf:
                    self._send_part()  # the last part may be short
                info = self._complete_multipart()
            self._buf = bytearray()
            self._state = "complete"
            self._result = info
            return info

    def _complete_multipart(self) -> ObjectInfo:
        s = self.store
        what = f"complete multipart upload {self.upload_id} of {s.url(self.key)}"
        try:
            resp = s.client.complete_multipart_upload(
                Bucket=s.bucket, Key=self.key, UploadId=self.upload_id,
                MultipartUpload={"Parts": self._parts})
        except ClientError as e:
            # A retry after a lost response: the first call did complete the upload.
            if error_code(e) == "NoSuchUpload":
                try:
                    info = s.head(self.key)
                except ObjectNotFound:
                    info = None
                if info is not None and info.size == self._written:
                    log.info("%s: already completed by an earlier attempt", what)
                    return info
            raise translate(e, what) from e
        except BotoCoreError as e:
            raise translate(e, what) from e
        return ObjectInfo(self.key, self._written, datetime.now(UTC), _etag(resp.get("ETag")),
                          self.storage_class or STANDARD)

    def abort(self) -> None:
        with self._lock:
            if self._state in ("complete", "aborted"):
                return
            self._buf = bytearray()
            if self.upload_id is not None:
                self.store.abort_multipart(self.key, self.upload_id)
            self._state = "aborted"

    @property
    def bytes_written(self) -> int:
        return self._written

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)


# --- bucket administration (embedded stack, tests) -----------------------------------


def create_bucket(client: Any, bucket: str, region: str) -> None:
    """Create ``bucket`` in ``region``; an existing bucket we own is fine."""
    args: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        # us-east-1 refuses an explicit LocationConstraint; every other region needs one.
        args["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**args)
    except ClientError as e:
        if error_code(e) != "BucketAlreadyOwnedByYou":
            raise translate(e, f"create bucket s3://{bucket} in {region}") from e
        log.debug("bucket s3://%s already exists", bucket)
    except BotoCoreError as e:
        raise translate(e, f"create bucket s3://{bucket} in {region}") from e


def set_bucket_notifications(client: Any, bucket: str, queue_arn: str, *,
                             prefix: str | None = None) -> None:
    """Send ``s3:ObjectCreated:*`` and ``s3:ObjectRemoved:*`` of ``bucket`` to an SQS queue.

    Replaces the bucket's notification configuration. S3 then sends an ``s3:TestEvent``
    message to the queue first.
    """
    config: dict[str, Any] = {
        "Id": "replicator-segment-events",
        "QueueArn": queue_arn,
        "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
    }
    if prefix:
        config["Filter"] = {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}
    with aws_errors(f"set notifications of s3://{bucket} to {queue_arn}"):
        client.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [config]})


def set_lifecycle_for_temp(client: Any, bucket: str, temp_prefix: str, days: int = 1) -> None:
    """Expire ``temp_prefix/`` objects and abort incomplete multipart uploads after ``days``.

    Temporary objects left by a crashed writer, and multipart uploads (streamed temp objects,
    multipart copies to final keys) left open by a crash, cost money until removed. Replaces
    the bucket's lifecycle configuration.
    """
    rules = [
        {"ID": "replicator-expire-temp", "Status": "Enabled",
         "Filter": {"Prefix": temp_prefix.rstrip("/") + "/"},
         "Expiration": {"Days": days}},
        {"ID": "replicator-abort-incomplete-multipart", "Status": "Enabled",
         "Filter": {"Prefix": ""},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": days}},
    ]
    with aws_errors(f"set lifecycle of s3://{bucket}"):
        client.put_bucket_lifecycle_configuration(
            Bucket=bucket, LifecycleConfiguration={"Rules": rules})
