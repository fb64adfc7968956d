"""A streaming S3 upload holds at most the part being filled plus the part being sent, and
counts both in ``buffered_bytes`` (egress charges it to ``max_buffered_bytes``)."""

from __future__ import annotations

import tracemalloc
from typing import Any

from replicator.core.s3_upload import S3Upload

PART = 4 * 1024 * 1024


class StubClient:
    def __init__(self, upload: list[S3Upload]) -> None:
        self.upload = upload
        self.seen: list[tuple[int, int]] = []
        """(len(Body), buffered_bytes during the call)"""

    def create_multipart_upload(self, **kw: Any) -> dict[str, str]:
        return {"UploadId": "u1"}

    def upload_part(self, *, Body: Any, **kw: Any) -> dict[str, str]:
        self.seen.append((len(Body), self.upload[0].buffered_bytes))
        return {"ETag": '"e"'}


class StubStore:
    bucket = "b"
    part_size = PART

    def __init__(self, client: StubClient) -> None:
        self.client = client

    def url(self, key: str) -> str:
        return f"s3://b/{key}"

    def write_args(self, storage_class: str | None) -> dict[str, str]:
        return {}


def test_a_part_in_flight_is_counted_and_never_copied() -> None:
    holder: list[S3Upload] = []
    client = StubClient(holder)
    upload = S3Upload(StubStore(client), "temp/x", None)  # type: ignore[arg-type]
    holder.append(upload)
    chunk = b"x" * (PART // 4)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(9):                   # two full parts sent, a quarter left
            upload.write(chunk)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert [n for n, _ in client.seen] == [PART, PART]
    # While a part is sent it is counted (it left the fill buffer but is still held) ...
    assert all(counted == PART for _, counted in client.seen)
    assert upload.buffered_bytes == PART // 4
    # ... and held once: a copy for the request would make the peak two parts.
    assert peak < 1.5 * PART, peak
