"""Streaming multipart uploads of the S3 store (``S3ObjectStore.open_upload``)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from replicator.core.aws import aws_errors, error_code, translate
from replicator.core.errors import ObjectNotFound, StorageFatalError
from replicator.core.storage import STANDARD, ObjectInfo, Upload

if TYPE_CHECKING:
    from replicator.core.s3 import S3ObjectStore

log = logging.getLogger(__name__)


def _etag(value: Any) -> str:
    return str(value or "").strip('"')


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
        self._sending = 0
        """Bytes of the part being sent (it left ``_buf`` but is held until S3 answers)."""
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
        # The buffer itself is the body: a copy (``bytes(buf)``) would hold the part twice
        # while it is sent, memory the budget did not count. The part is counted in
        # ``buffered_bytes`` until S3 answered.
        part, self._buf = self._buf, bytearray()
        self._sending = len(part)
        try:
            with aws_errors(f"upload part {number} of {s.url(self.key)}"):
                resp = s.client.upload_part(Bucket=s.bucket, Key=self.key,
                                            UploadId=self.upload_id, PartNumber=number,
                                            Body=part)
        except BaseException:
            self._buf = part + self._buf        # unusable now, but kept as it was
            raise
        finally:
            self._sending = 0
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})

    def complete(self) -> ObjectInfo:
        with self._lock:
            if self._result is not None:
                return self._result
            self._check_open("complete")
            s = self.store
            if self.upload_id is None:
                # Below one part: a single PutObject is cheaper than a multipart upload.
                # Below one part: the copy ``put`` sends is counted while it is sent.
                self._sending = len(self._buf)
                try:
                    info = s.put(self.key, bytes(self._buf), storage_class=self.storage_class)
                finally:
                    self._sending = 0
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
        """The part being filled, plus the part being sent."""
        return len(self._buf) + self._sending
