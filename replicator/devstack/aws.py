"""Bucket and queue administration of the embedded stack and the tests: create buckets, the
lifecycle rule for temporary objects, S3 → SQS notifications, the queue and its policy.

Production never runs this (``deploy/aws/`` sets the same things up in AWS); it lives next
to the embedded stack so that the production seams (``replicator.core.s3``, ``sqs``) only
read and write objects and messages.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from replicator.core.aws import aws_errors, error_code, translate

log = logging.getLogger(__name__)


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


def s3_send_policy(queue_arn: str, source_bucket: str | None = None) -> str:
    """A queue policy allowing S3 (optionally only ``source_bucket``) to send messages."""
    statement: dict[str, Any] = {
        "Sid": "AllowS3BucketNotifications",
        "Effect": "Allow",
        "Principal": {"Service": "s3.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": queue_arn,
    }
    if source_bucket:
        statement["Condition"] = {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{source_bucket}"}}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def create_queue(client: Any, name: str, *, source_bucket: str | None = None) -> str:
    """Create queue ``name`` (an existing one is reused) allowing S3 to send; return its URL."""
    what = f"create SQS queue {name}"
    try:
        url = str(client.create_queue(QueueName=name)["QueueUrl"])
    except ClientError as e:
        if error_code(e) not in ("QueueAlreadyExists", "QueueNameExists"):
            raise translate(e, what) from e
        # Exists with other attributes: reuse it, the policy is (re)set below.
        with aws_errors(what):
            url = str(client.get_queue_url(QueueName=name)["QueueUrl"])
    except BotoCoreError as e:
        raise translate(e, what) from e
    with aws_errors(f"{what}: set policy"):
        arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        client.set_queue_attributes(
            QueueUrl=url, Attributes={"Policy": s3_send_policy(arn, source_bucket)})
    return url
