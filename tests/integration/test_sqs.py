"""The SQS seam against the session's moto server: queue admin, S3 → SQS notifications from a
real bucket, receive/delete/visibility, and error translation."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import unquote_plus

import pytest

from replicator.core.errors import ObjectNotFound, StorageError
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import load_settings
from replicator.core.sqs import QueueMessage, SqsQueue, make_sqs_client
from replicator.devstack.aws import create_bucket, create_queue, set_bucket_notifications
from replicator.devstack.processes import free_port
from tests.conftest import unique_name

MiB = 1024**2
REGION = "us-west-1"  # the destination region of the embedded stack


@pytest.fixture(scope="module")
def sqs_client(moto_endpoint: str) -> Any:
    return make_sqs_client(endpoint_url=moto_endpoint, region=REGION, access_key_id="test",
                           secret_access_key="test")


@pytest.fixture(scope="module")
def s3_client(moto_endpoint: str) -> Any:
    return make_s3_client(endpoint_url=moto_endpoint, region=REGION, access_key_id="test",
                          secret_access_key="test")


@pytest.fixture
def queue(sqs_client: Any) -> SqsQueue:
    name = unique_name("q")
    create_queue(sqs_client, name)
    return SqsQueue(sqs_client, name)


def receive_all(queue: SqsQueue, count: int, *, timeout: float = 10) -> list[QueueMessage]:
    """Receive until ``count`` messages arrived (or the timeout), then one more short poll."""
    got: list[QueueMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += queue.receive(wait_seconds=1, visibility_timeout=60)
    got += queue.receive(wait_seconds=0, visibility_timeout=60)  # nothing extra may follow
    return got


def events(messages: list[QueueMessage]) -> list[tuple[str, str]]:
    """(eventName, decoded key) of every S3 record; ("s3:TestEvent", "") for test events."""
    out: list[tuple[str, str]] = []
    for m in messages:
        body = json.loads(m.body)
        if body.get("Event") == "s3:TestEvent":
            out.append(("s3:TestEvent", ""))
        for r in body.get("Records", []):
            out.append((r["eventName"], unquote_plus(r["s3"]["object"]["key"])))
    return out


def test_create_queue_is_idempotent_and_lets_s3_send(sqs_client: Any) -> None:
    name = unique_name("q")
    url = create_queue(sqs_client, name, source_bucket="some-bucket")
    assert create_queue(sqs_client, name, source_bucket="some-bucket") == url
    q = SqsQueue(sqs_client, name)
    assert q.url == url
    assert q.arn.endswith(f":{name}")
    assert q.arn.startswith(f"arn:aws:sqs:{REGION}:")
    policy = json.loads(sqs_client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    (stmt,) = policy["Statement"]
    assert stmt["Principal"] == {"Service": "s3.amazonaws.com"}
    assert stmt["Action"] == "sqs:SendMessage"
    assert stmt["Resource"] == q.arn
    assert stmt["Condition"]["ArnLike"]["aws:SourceArn"] == "arn:aws:s3:::some-bucket"
    by_url = SqsQueue(sqs_client, url)
    assert by_url.name == name
    assert by_url.arn == q.arn


def test_missing_queue_is_object_not_found(sqs_client: Any) -> None:
    q = SqsQueue(sqs_client, "no-such-queue-42")  # constructing does not call SQS
    with pytest.raises(ObjectNotFound) as exc:
        q.receive(wait_seconds=0)
    assert "no-such-queue-42" in str(exc.value)


def test_s3_notifications_reach_the_queue(s3_client: Any, queue: SqsQueue) -> None:
    bucket = unique_name("dest")
    create_bucket(s3_client, bucket, REGION)
    set_bucket_notifications(s3_client, bucket, queue.arn, prefix="data/")
    store = S3ObjectStore(s3_client, bucket, part_size=5 * MiB)

    # The notification configuration itself sends a TestEvent first.
    first = receive_all(queue, 1)
    assert events(first) == [("s3:TestEvent", "")]
    assert queue.delete(first) == []

    key = "data/us-east-1/sensor.events/3/0/00000000000000000000-00000000000000000099"
    store.put(key, b"segment")
    store.put("temp/ignored", b"outside the prefix")
    up = store.open_upload("data/a b/multi+part")  # needs URL decoding
    up.write(b"x" * (6 * MiB))
    up.complete()
    store.delete(key)
    msgs = receive_all(queue, 4)
    got = events(msgs)
    assert sorted(got) == sorted([
        ("ObjectCreated:Put", key),
        # moto sends two events for one CompleteMultipartUpload (docs/testing.md).
        ("ObjectCreated:Put", "data/a b/multi+part"),
        ("ObjectCreated:CompleteMultipartUpload", "data/a b/multi+part"),
        ("ObjectRemoved:Delete", key),
    ])
    assert all(m.receive_count == 1 for m in msgs)
    assert queue.delete(msgs) == []
    assert queue.receive(wait_seconds=1) == []


def test_visibility_and_receive_count(sqs_client: Any, queue: SqsQueue) -> None:
    sqs_client.send_message(QueueUrl=queue.url, MessageBody="hello")
    (m,) = queue.receive(wait_seconds=1, visibility_timeout=60)
    assert (m.body, m.receive_count) == ("hello", 1)
    assert queue.receive(wait_seconds=0) == []  # hidden
    queue.change_visibility(m, 0)
    (again,) = queue.receive(wait_seconds=1, visibility_timeout=60)
    assert again.message_id == m.message_id
    assert again.receive_count == 2
    assert queue.delete([again]) == []


def test_delete_reports_refused_messages(sqs_client: Any, queue: SqsQueue) -> None:
    for n in range(12):
        sqs_client.send_message(QueueUrl=queue.url, MessageBody=f"m{n}")
    msgs = receive_all(queue, 12)
    assert len(msgs) == 12
    bogus = QueueMessage("bogus-id", "not-a-receipt-handle", "", 1)
    # 13 entries: two DeleteMessageBatch calls; only the bogus one fails.
    assert queue.delete([*msgs[:6], bogus, *msgs[6:]]) == ["bogus-id"]
    assert queue.receive(wait_seconds=0) == []


def test_from_settings(moto_endpoint: str, sqs_client: Any) -> None:
    name = unique_name("q")
    create_queue(sqs_client, name)
    settings = load_settings(None, data={
        "region": REGION,
        "s3": {"bucket": "b", "endpoint_url": moto_endpoint, "access_key_id": "test",
               "secret_access_key": "test"},
        "kafka": {"brokers": "127.0.0.1:1"},
        "ingress": {"sqs_queue": name, "sources": [{"region": "us-east-1", "topic": "t"}]},
    }, environ={})
    q = SqsQueue.from_settings(settings)
    assert q.client.meta.region_name == REGION
    assert q.client.meta.endpoint_url == moto_endpoint
    assert q.receive(wait_seconds=0) == []


def test_unreachable_endpoint_is_retriable() -> None:
    client = make_sqs_client(endpoint_url=f"http://127.0.0.1:{free_port()}", region=REGION,
                             access_key_id="test", secret_access_key="test",
                             connect_timeout=0.5, max_attempts=1)
    q = SqsQueue(client, "my-queue")
    with pytest.raises(StorageError) as exc:
        q.receive(wait_seconds=0)
    assert "my-queue" in str(exc.value)
