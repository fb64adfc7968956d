"""``S3ObjectStore`` through the ``ObjectStore`` contract against the session's moto server,
plus what only S3 has: error translation, encryption, pagination of real pages, bucket admin.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from replicator.core.aws import translate
from replicator.core.errors import (
    ObjectNotFound,
    PreconditionFailed,
    RetriableError,
    StorageError,
    StorageFatalError,
)
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import load_settings
from replicator.devstack.aws import create_bucket, set_lifecycle_for_temp
from replicator.devstack.processes import free_port
from tests.conftest import unique_name
from tests.contract.object_store import ObjectStoreContract

MiB = 1024**2


class TestS3ObjectStore(ObjectStoreContract):
    @pytest.fixture(autouse=True)
    def _store(self, s3_client: Any, bucket: str) -> None:
        self.part_size = 5 * MiB  # S3's minimum part size
        self.copy_threshold = 5 * MiB
        self.s3 = S3ObjectStore(s3_client, bucket, part_size=self.part_size,
                                multipart_copy_threshold=self.copy_threshold, page_size=7)
        self.store = self.s3
        other = unique_name("b")
        create_bucket(s3_client, other, "us-east-1")
        self.other = S3ObjectStore(s3_client, other)

    def open_uploads(self) -> int:
        return len(self.s3.open_multipart_uploads())


# --- S3 only -------------------------------------------------------------------------


def test_list_more_than_1000_keys_with_default_pages(s3_client: Any, bucket: str) -> None:
    store = S3ObjectStore(s3_client, bucket)
    keys = [f"k/{n:06d}" for n in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3_client.put_object(Bucket=bucket, Key=k, Body=b""), keys))
    assert [o.key for o in store.list("k/")] == keys
    assert [o.key for o in store.list("k/", start_after="k/000999")] == keys[1000:]


def test_multipart_copy_uses_parts_and_keeps_metadata(s3_client: Any, bucket: str) -> None:
    store = S3ObjectStore(s3_client, bucket, part_size=5 * MiB,
                          multipart_copy_threshold=5 * MiB)
    data = bytes(range(256)) * (11 * MiB // 256)
    s3_client.put_object(Bucket=bucket, Key="src", Body=data, ContentType="application/x-seg",
                         Metadata={"origin": "test"})
    store.copy("src", "dst")
    head = s3_client.head_object(Bucket=bucket, Key="dst")
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 1 MiB parts
    assert head["ContentType"] == "application/x-seg"
    assert head["Metadata"] == {"origin": "test"}
    small = S3ObjectStore(s3_client, bucket)  # below its 5 GiB threshold: one CopyObject
    small.copy("src", "dst2")
    head2 = s3_client.head_object(Bucket=bucket, Key="dst2")
    assert "-" not in head2["ETag"]
    assert head2["Metadata"] == {"origin": "test"}


def test_server_side_encryption_on_every_write(s3_client: Any, bucket: str) -> None:
    store = S3ObjectStore(s3_client, bucket, part_size=5 * MiB,
                          multipart_copy_threshold=5 * MiB, sse="AES256")
    store.put("put", b"x")
    up = store.open_upload("upload")
    up.write(b"y" * (6 * MiB))
    up.complete()
    store.copy("upload", "copy-multipart")
    store.copy("put", "copy-small")
    for key in ("put", "upload", "copy-multipart", "copy-small"):
        assert s3_client.head_object(Bucket=bucket, Key=key)["ServerSideEncryption"] == "AES256"


def test_upload_small_object_is_one_put(s3_client: Any, bucket: str) -> None:
    store = S3ObjectStore(s3_client, bucket, part_size=5 * MiB)
    up = store.open_upload("temp/x")
    up.write(b"z" * 1000)
    assert store.open_multipart_uploads() == []
    up.complete()
    assert "-" not in s3_client.head_object(Bucket=bucket, Key="temp/x")["ETag"]


def test_conditional_complete_race(s3_client: Any, bucket: str) -> None:
    store = S3ObjectStore(s3_client, bucket)
    store.put("seg", b"a", if_none_match=True)
    with pytest.raises(PreconditionFailed) as exc:
        store.put("seg", b"b", if_none_match=True)
    assert f"s3://{bucket}/seg" in str(exc.value)
    assert isinstance(exc.value.__cause__, ClientError)


def test_missing_bucket_is_object_not_found(s3_client: Any) -> None:
    store = S3ObjectStore(s3_client, unique_name("nobucket"))
    with pytest.raises(ObjectNotFound) as exc:
        store.get("k")
    assert store.bucket in str(exc.value)
    with pytest.raises(ObjectNotFound):
        list(store.list("x/"))


def test_unreachable_endpoint_is_retriable_and_names_bucket() -> None:
    client = make_s3_client(endpoint_url=f"http://127.0.0.1:{free_port()}", region="us-east-1",
                            access_key_id="test", secret_access_key="test",
                            connect_timeout=0.5, read_timeout=1, max_attempts=1)
    store = S3ObjectStore(client, "some-bucket")
    started = time.monotonic()
    for call in (lambda: store.head("k/1"), lambda: store.put("k/1", b"x"),
                 lambda: list(store.list("k/"))):
        with pytest.raises(StorageError) as exc:
            call()
        assert isinstance(exc.value, RetriableError)
        assert "some-bucket" in str(exc.value)
        assert exc.value.__cause__ is not None
    assert time.monotonic() - started < 10


def test_from_settings(moto_endpoint: str) -> None:
    bucket = unique_name("b")
    settings = load_settings(None, data={
        "region": "us-west-1",
        "s3": {"bucket": bucket, "endpoint_url": moto_endpoint, "access_key_id": "test",
               "secret_access_key": "test", "part_size": "6MiB", "sse": "AES256"},
        "kafka": {"brokers": "127.0.0.1:1"},
    }, environ={})
    store = S3ObjectStore.from_settings(settings)
    assert store.bucket == bucket
    assert store.part_size == 6 * MiB
    assert store.sse == "AES256"
    assert store.client.meta.region_name == "us-west-1"
    create_bucket(store.client, bucket, "us-west-1")
    create_bucket(store.client, bucket, "us-west-1")  # idempotent
    assert store.client.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "us-west-1"
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_lifecycle_for_temp(s3_client: Any, bucket: str) -> None:
    set_lifecycle_for_temp(s3_client, bucket, "temp", days=2)
    rules = s3_client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    by_id = {r["ID"]: r for r in rules}
    temp = by_id["replicator-expire-temp"]
    assert temp["Expiration"]["Days"] == 2
    assert temp["Filter"]["Prefix"] == "temp/"
    abort = by_id["replicator-abort-incomplete-multipart"]
    assert abort["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 2


# --- error translation (pure) ----------------------------------------------------------


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(cast(Any, {"Error": {"Code": code, "Message": "msg"},
                                  "ResponseMetadata": {"HTTPStatusCode": status}}), "Op")


@pytest.mark.parametrize(("code", "status", "kind"), [
    ("NoSuchKey", 404, ObjectNotFound),
    ("404", 404, ObjectNotFound),
    ("NoSuchBucket", 404, ObjectNotFound),
    ("AWS.SimpleQueueService.NonExistentQueue", 400, ObjectNotFound),
    ("PreconditionFailed", 412, PreconditionFailed),
    ("SlowDown", 503, StorageError),
    ("ServiceUnavailable", 503, StorageError),
    ("InternalError", 500, StorageError),
    ("RequestTimeout", 400, StorageError),
    ("Throttling", 400, StorageError),
    ("ThrottlingException", 400, StorageError),
    ("Whatever", 502, StorageError),
    ("AccessDenied", 403, StorageFatalError),
    ("InvalidRequest", 400, StorageFatalError),
    ("NoSuchUpload", 404, StorageFatalError),
])
def test_translate_client_errors(code: str, status: int, kind: type[Exception]) -> None:
    err = translate(_client_error(code, status), "get s3://bkt/some/key")
    assert type(err) is kind
    assert "s3://bkt/some/key" in str(err)


def test_translate_transport_errors() -> None:
    assert isinstance(translate(EndpointConnectionError(endpoint_url="http://x"), "w"),
                      StorageError)
    assert isinstance(translate(ReadTimeoutError(endpoint_url="http://x"), "w"), StorageError)
    assert isinstance(translate(ValueError("x"), "w"), StorageFatalError)



# --- faults: a real client that fails chosen calls --------------------------------------


class FlakyClient:
    """Wraps a real S3 client; ``fail[method]`` calls of ``method`` raise before (or, for
    ``lost``, after) reaching S3 with a retriable 500."""

    def __init__(self, real: Any, fail: dict[str, int] | None = None,
                 lost: dict[str, int] | None = None) -> None:
        self.real = real
        self.fail = dict(fail or {})
        self.lost = dict(lost or {})
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr) or name.startswith(("get_paginator", "meta")):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.fail.get(name, 0) > 0:
                self.fail[name] -= 1
                raise _client_error("InternalError", 500)
            result = attr(*args, **kwargs)
            if self.lost.get(name, 0) > 0:
                self.lost[name] -= 1
                raise _client_error("InternalError", 500)  # done, but the answer was lost
            return result

        return call


def test_complete_retried_after_failure(s3_client: Any, bucket: str) -> None:
    flaky = FlakyClient(s3_client, fail={"complete_multipart_upload": 2})
    store = S3ObjectStore(flaky, bucket, part_size=5 * MiB)
    data = bytes(range(256)) * (12 * MiB // 256)
    up = store.open_upload("temp/seg")
    up.write(data)
    for _ in range(2):
        with pytest.raises(StorageError):
            up.complete()
    info = up.complete()
    assert info.size == len(data)
    assert store.get("temp/seg") == data
    assert store.open_multipart_uploads() == []
    assert flaky.calls["upload_part"] == 3  # the last part was sent once only


def test_complete_whose_answer_was_lost(s3_client: Any, bucket: str) -> None:
    flaky = FlakyClient(s3_client, lost={"complete_multipart_upload": 1})
    store = S3ObjectStore(flaky, bucket, part_size=5 * MiB)
    data = b"q" * (6 * MiB)
    up = store.open_upload("temp/seg")
    up.write(data)
    with pytest.raises(StorageError):
        up.complete()
    # The retry finds the upload gone (NoSuchUpload) and the object complete.
    assert up.complete().size == len(data)
    assert store.get("temp/seg") == data


def test_failed_part_leaves_upload_for_abort(s3_client: Any, bucket: str) -> None:
    flaky = FlakyClient(s3_client, fail={"upload_part": 1})
    store = S3ObjectStore(flaky, bucket, part_size=5 * MiB)
    up = store.open_upload("temp/seg")
    with pytest.raises(StorageError) as exc:
        up.write(b"a" * (6 * MiB))
    assert f"s3://{bucket}/temp/seg" in str(exc.value)
    with pytest.raises(StorageFatalError):
        up.write(b"more")  # bytes may be missing: the upload cannot continue
    assert len(store.open_multipart_uploads()) == 1
    up.abort()
    assert store.open_multipart_uploads() == []
    assert list(store.list("temp/")) == []


def test_failed_multipart_copy_aborts(s3_client: Any, bucket: str) -> None:
    flaky = FlakyClient(s3_client, fail={"upload_part_copy": 1})
    store = S3ObjectStore(flaky, bucket, part_size=5 * MiB, multipart_copy_threshold=5 * MiB,
                          copy_concurrency=1)
    s3_client.put_object(Bucket=bucket, Key="src", Body=b"c" * (11 * MiB))
    with pytest.raises(StorageError) as exc:
        store.copy("src", "dst")
    assert "dst" in str(exc.value)
    assert store.open_multipart_uploads() == []
    with pytest.raises(ObjectNotFound):
        store.head("dst")
    store.copy("src", "dst")  # the retry works
    assert store.head("dst").size == 11 * MiB


class RefusingDeletes(FlakyClient):
    def __init__(self, real: Any, code: str) -> None:
        super().__init__(real)
        self.code = code

    def delete_objects(self, **kwargs: Any) -> Any:
        keys = [o["Key"] for o in kwargs["Delete"]["Objects"]]
        return {"Errors": [{"Key": k, "Code": self.code, "Message": "no"}
                           for k in keys if k.endswith("7")]}


@pytest.mark.parametrize(("code", "kind"), [("AccessDenied", StorageFatalError),
                                            ("InternalError", StorageError)])
def test_delete_many_names_refused_keys(s3_client: Any, bucket: str, code: str,
                                        kind: type[Exception]) -> None:
    store = S3ObjectStore(RefusingDeletes(s3_client, code), bucket)
    with pytest.raises(kind) as exc:
        store.delete_many([f"k/{n}" for n in range(1200)])
    assert type(exc.value) is kind
    msg = str(exc.value)
    assert "120 key(s)" in msg
    assert "k/7 (" + code + ")" in msg
    assert bucket in msg
