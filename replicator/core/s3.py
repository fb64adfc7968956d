"""The S3 implementation of ``ObjectStore``: the only module that talks to S3 through boto3
(with ``s3_upload``, its streaming uploads).

Everything S3-specific stays here: client construction (timeouts, retries, connection pool),
multipart server-side copy above 5 GiB, conditional create (``If-None-Match: *``), paginated
listing, batched deletes and server-side encryption. botocore errors are translated by
``replicator.core.aws`` (shared with SQS). Bucket administration for the embedded stack
(create, notifications, lifecycle) lives in ``replicator.devstack.aws``: production never
creates buckets.
"""

from __future__ import annotations

import builtins
import logging
import math
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from replicator.core.aws import (
    RETRIABLE_CODES,
    aws_errors,
    client_config,
    error_code,
    http_status,
    translate,
)
from replicator.core.errors import ReplicatorError, StorageError, StorageFatalError
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


@dataclass(frozen=True)
class BucketHead:
    """What HeadBucket tells: the bucket exists and answers, and the server's clock."""

    region: str | None
    """``x-amz-bucket-region`` (``None`` when the store does not send it)."""
    server_time: datetime | None
    """The response's ``Date`` header (whole seconds; ``None`` when absent)."""
    sent: datetime
    """This host's clock when the request was sent ..."""
    received: datetime
    """... and when the answer came (the server's time lies between them)."""


@dataclass(frozen=True)
class QueueNotification:
    """One S3 → SQS event notification of a bucket."""

    queue_arn: str
    events: tuple[str, ...]
    prefix: str
    """The key prefix filter ("" for every key)."""


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
        key, secret = s3.static_keys()
        client = make_s3_client(
            endpoint_url=s3.endpoint_url, region=settings.s3_region,
            access_key_id=key, secret_access_key=secret,
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
            if_match: str | None = None, storage_class: str | None = None,
            content_type: str | None = None) -> ObjectInfo:
        args = self.write_args(storage_class, content_type)
        if if_none_match:
            args["IfNoneMatch"] = "*"
        if if_match is not None:
            args["IfMatch"] = f'"{if_match}"'
        with aws_errors(f"put {self.url(key)}"):
            resp = self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(data), **args)
        return ObjectInfo(key, len(data), datetime.now(UTC), _etag(resp.get("ETag")),
                          storage_class or STANDARD)

    def open_upload(self, key: str, *, storage_class: str | None = None) -> Upload:
        from replicator.core.s3_upload import S3Upload

        return S3Upload(self, key, storage_class)

    def get(self, key: str) -> bytes:
        with aws_errors(f"get {self.url(key)}"):
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return bytes(resp["Body"].read())

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        with aws_errors(f"get {self.url(key)}"):
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return bytes(resp["Body"].read()), _etag(resp.get("ETag"))

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
                          _etag(resp.get("ETag")), resp.get("StorageClass") or STANDARD,
                          resp.get("ReplicationStatus"))

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

    def list_folders(self, prefix: str) -> builtins.list[str]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/",
                                "PaginationConfig": {"PageSize": self.page_size}}
        found: builtins.list[str] = []
        with aws_errors(f"list folders of s3://{self.bucket}/{prefix}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(**args):
                for item in page.get("CommonPrefixes", []):
                    found.append(item["Prefix"][len(prefix):].rstrip("/"))
        return sorted(found)

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

    def copy_from(self, source: ObjectStore, key: str, *,
                  storage_class: str | None = None) -> None:
        # One CopyObject sent to this store's client (the destination region's endpoint);
        # S3 reads the source object itself. No HEAD first: a segment is far below the
        # 5 GiB a single CopyObject takes, and S3 refuses a larger one by itself.
        what = f"copy s3://{source.bucket}/{key} to {self.url(key)}"
        with aws_errors(what):
            resp = self.client.copy_object(
                Bucket=self.bucket, Key=key, CopySource={"Bucket": source.bucket, "Key": key},
                **self.write_args(storage_class))
        if not resp.get("CopyObjectResult"):
            # S3 may answer 200 with an error in the body; botocore raises it, but a body
            # without a result is no copy either.
            raise StorageError(f"{what}: no CopyObjectResult in the answer")

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

    def head_bucket(self) -> BucketHead:
        """HeadBucket: the bucket exists and these credentials may use it.

        Raises:
            ObjectNotFound: no such bucket.
            StorageFatalError: access denied (403), or another refusal.
            StorageError: the endpoint did not answer.
        """
        sent = datetime.now(UTC)
        with aws_errors(f"head bucket s3://{self.bucket}"):
            resp = self.client.head_bucket(Bucket=self.bucket)
        received = datetime.now(UTC)
        headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        server_time = None
        if headers.get("date"):
            try:
                server_time = parsedate_to_datetime(headers["date"])
            except (TypeError, ValueError):
                server_time = None
        return BucketHead(headers.get("x-amz-bucket-region"), server_time, sent, received)

    def versioning(self) -> str | None:
        """The bucket's versioning status: ``"Enabled"``, ``"Suspended"``, or ``None`` when
        it was never enabled.
        """
        with aws_errors(f"get versioning of s3://{self.bucket}"):
            resp = self.client.get_bucket_versioning(Bucket=self.bucket)
        status = resp.get("Status")
        return str(status) if status else None

    def queue_notifications(self) -> builtins.list[QueueNotification]:
        """The bucket's event notifications to SQS queues."""
        with aws_errors(f"get notification configuration of s3://{self.bucket}"):
            resp = self.client.get_bucket_notification_configuration(Bucket=self.bucket)
        out: builtins.list[QueueNotification] = []
        for q in resp.get("QueueConfigurations", []):
            rules = q.get("Filter", {}).get("Key", {}).get("FilterRules", [])
            prefix = next((r.get("Value", "") for r in rules
                           if str(r.get("Name", "")).lower() == "prefix"), "")
            out.append(QueueNotification(str(q.get("QueueArn", "")),
                                         tuple(q.get("Events", [])), prefix))
        return out

    def open_multipart_uploads(self, prefix: str = "") -> builtins.list[tuple[str, str]]:
        """``(key, upload_id)`` of multipart uploads not completed nor aborted."""
        out: builtins.list[tuple[str, str]] = []
        with aws_errors(f"list multipart uploads s3://{self.bucket}/{prefix}*"):
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=self.bucket, Prefix=prefix):
                out.extend((u["Key"], u["UploadId"]) for u in page.get("Uploads", []))
        return out
