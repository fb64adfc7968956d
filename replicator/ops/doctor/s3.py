"""S3 checks of ``replicator doctor``: the bucket answers, its versioning, a temporary object
written, read and deleted under the temp prefix (configs of writers: egress, compaction) or
the source prefixes listed (ingress, which writes nothing), the bucket's event notification
to ingress's queue, and this host's clock against S3's.

The decisions (``bucket_check``, ``versioning_check``, ``notification_check``,
``skew_check``) are pure; ``temp_object_check`` and ``list_check`` run on any
``ObjectStore``; ``s3_checks`` reads the bucket through the S3 seam (``BucketProbe`` here).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from replicator.core.errors import ObjectNotFound, ReplicatorError, StorageError
from replicator.core.s3 import BucketHead, QueueNotification
from replicator.core.settings import Settings
from replicator.core.storage import ObjectStore
from replicator.ops.doctor.report import Check, fail, passed, warn

BUCKET = "s3 bucket"

SKEW_TOLERANCE = timedelta(seconds=2)
"""Skew that is no skew: the Date header has whole seconds, and the request takes time."""
MAX_SKEW = timedelta(minutes=15)
"""S3 refuses signed requests from a clock further off (RequestTimeTooSkewed)."""


class BucketProbe(Protocol):
    """What the S3 checks read of the bucket (``replicator.core.s3.S3ObjectStore``)."""

    bucket: str

    def head_bucket(self) -> BucketHead: ...
    def versioning(self) -> str | None: ...
    def queue_notifications(self) -> list[QueueNotification]: ...


def bucket_check(bucket: str, head: BucketHead | None, error: ReplicatorError | None) -> Check:
    """PASS when HeadBucket answered; FAIL naming why not (missing, denied, unreachable)."""
    if error is None:
        region = f" (region {head.region})" if head is not None and head.region else ""
        return passed(BUCKET, f"s3://{bucket} answers{region}")
    if isinstance(error, ObjectNotFound):
        return fail(BUCKET, f"s3://{bucket} does not exist",
                    "create the bucket (deploy/aws/setup-region.sh) or fix s3.bucket")
    if isinstance(error, StorageError):
        return fail(BUCKET, f"no answer: {error}",
                    "check s3.endpoint_url and the network path to S3")
    return fail(BUCKET, f"refused: {error}",
                "grant s3:ListBucket on the bucket to this principal (docs/deploy.md, IAM), "
                "or fix s3.access_key_id / the credential chain")


MIRROR = "s3 mirror bucket"


def mirror_check(bucket: str, region: str, head: BucketHead | None,
                 error: ReplicatorError | None) -> Check:
    """The low-RPO mirror's destination bucket (``[egress.mirror]``), asked with HeadBucket
    through the mirror's own client (pure decision): PASS when it answers in
    ``egress.mirror.region``; FAIL when it does not exist, does not answer, or is in
    another region. HeadBucket needs ``s3:ListBucket``, which the copies do not: a 403 says
    the bucket exists and passes (the copies' ``s3:PutObject`` cannot be tried without
    leaving an object in the destination bucket, docs/operations.md).
    """
    where = f"s3://{bucket}"
    if error is None:
        found = head.region if head is not None else None
        if found and found != region:
            return fail(MIRROR, f"{where} is in {found}, not egress.mirror.region {region}",
                        f"set egress.mirror.region = \"{found}\" (or name the bucket of "
                        f"{region})")
        return passed(MIRROR, f"{where} answers the mirror's client ({region})")
    if isinstance(error, ObjectNotFound):
        return fail(MIRROR, f"{where} does not exist (NoSuchBucket)",
                    "fix egress.mirror.bucket: the destination region's bucket, the one its "
                    "ingress reads")
    if isinstance(error, StorageError):
        return fail(MIRROR, f"no answer from {where}: {error}",
                    "check egress.mirror.region / endpoint_url and the network path to the "
                    "destination region")
    # S3 answers 404 for a bucket that does not exist whoever asks, and 403 for one that
    # exists but denies HeadBucket (s3:ListBucket, which the copies do not need and
    # deploy/aws/iam/egress-mirror.json does not grant).
    return passed(MIRROR, f"{where} exists (HeadBucket refused without s3:ListBucket, "
                  f"which the copies do not need: {error}); its s3:PutObject grant is "
                  "seen in replicator_egress_mirror_failures_total only")


def versioning_check(bucket: str, status: str | None) -> Check:
    """WARN unless versioning is ``Enabled``: S3 replication between the regions' buckets
    needs it on both (a deployment that copies with ``replicator sync`` does not).
    """
    name = "s3 versioning"
    if status == "Enabled":
        return passed(name, "Enabled")
    return warn(name, f"{status or 'never enabled'} on s3://{bucket}",
                f"aws s3api put-bucket-versioning --bucket {bucket} --versioning-configuration "
                "Status=Enabled (S3 replication needs it; not needed with replicator sync)")


def temp_object_check(store: ObjectStore, temp_prefix: str) -> Check:
    """Put, head, get and delete one small object under ``temp_prefix/`` (with the
    store's encryption settings): the permissions and the KMS key every writer needs.
    """
    name = "s3 temp object"
    key = f"{temp_prefix}/doctor-{uuid.uuid4().hex[:12]}"
    data = b"replicator doctor " + key.encode()
    step = "put"
    try:
        store.put(key, data, content_type="text/plain")
        step = "head"
        size = store.head(key).size
        step = "get"
        got = store.get(key)
        step = "delete"
        store.delete(key)
    except ReplicatorError as e:
        return fail(name, f"{step} {key}: {e}",
                    f"grant s3:{_ACTIONS[step]} on {temp_prefix}/* (docs/deploy.md, IAM)"
                    f"{'; check s3.sse_kms_key_id and its key policy' if step == 'put' else ''}")
    if got != data or size != len(data):
        return fail(name, f"{key}: read {len(got)} bytes (head {size}), wrote {len(data)}",
                    "the store does not return what was written: check s3.endpoint_url")
    return passed(name, f"put, head, get, delete {key} ({len(data)} bytes)")


def list_check(store: ObjectStore, prefixes: Sequence[str]) -> Check:
    """List the first keys under each of ``prefixes`` (what ingress reads: it writes
    nothing to the bucket, so no temporary object is written for it).
    """
    name = "s3 list"
    found = []
    for prefix in prefixes:
        try:
            first = next(iter(store.list(prefix)), None)
        except ReplicatorError as e:
            return fail(name, f"list {prefix}: {e}",
                        "grant s3:ListBucket on the bucket (docs/deploy.md, IAM)")
        found.append(f"{prefix}: {'objects' if first is not None else 'empty so far'}")
    return passed(name, "; ".join(found) or "nothing to list")


_ACTIONS = {"put": "PutObject", "head": "GetObject", "get": "GetObject",
            "delete": "DeleteObject"}


def notification_check(bucket: str, queue: str, queue_arn: str, prefixes: Sequence[str],
                       notifications: Sequence[QueueNotification]) -> Check:
    """The bucket sends object created and removed events under ``prefixes`` (what
    ingress reads) to the queue: FAIL without a notification to it (segments are found
    only by the rescans every ``ingress.rescan_interval``), WARN when events or keys are
    left out.
    """
    name = "s3 notifications"
    mine = [n for n in notifications if n.queue_arn == queue_arn]
    if not mine:
        others = ", ".join(sorted({n.queue_arn for n in notifications})) or "none"
        return fail(name, f"s3://{bucket} sends no events to {queue} (queues notified: "
                          f"{others})",
                    f"add a notification of s3:ObjectCreated:* and s3:ObjectRemoved:* to "
                    f"{queue_arn} (deploy/aws/s3/notification.json)")
    events = {e for n in mine for e in n.events}
    seen = (f"{', '.join(sorted(events))} to {queue}"
            f"{''.join(f' (prefix {n.prefix!r})' for n in mine if n.prefix)}")
    missing = [kind for kind in ("ObjectCreated", "ObjectRemoved")
               if not any(e in (f"s3:{kind}:*", "s3:*") for e in events)]
    if missing:
        return warn(name, seen, f"notify {', '.join(f's3:{k}:*' for k in missing)} too "
                                "(removed events let ingress forget compacted segments)")
    uncovered = [p for p in prefixes
                 if not any(p.startswith(n.prefix) for n in mine)]
    if uncovered:
        return warn(name, seen, f"the prefix filter leaves out {', '.join(uncovered)}: "
                                "filter on the segments' prefix (s3.prefix)")
    return passed(name, seen)


def skew_check(head: BucketHead) -> Check:
    """This host's clock against the ``Date`` of S3's answer (segment ages, late and lost
    timeouts are measured against S3's times): WARN above ``SKEW_TOLERANCE`` plus the
    round trip, FAIL above ``MAX_SKEW``.
    """
    name = "clock skew (S3)"
    if head.server_time is None:
        return warn(name, "S3 sent no Date header", "compare this host's clock with NTP")
    rtt = head.received - head.sent
    local = head.sent + rtt / 2
    skew = head.server_time - local
    off = abs(skew.total_seconds())
    seen = (f"this host is {off:.1f}s {'behind' if skew > timedelta(0) else 'ahead of'} "
            f"S3 (round trip {rtt.total_seconds() * 1000:.0f} ms)")
    if abs(skew) <= SKEW_TOLERANCE + rtt:
        return passed(name, f"within {(SKEW_TOLERANCE + rtt).total_seconds():.1f}s of S3")
    if abs(skew) > MAX_SKEW:
        return fail(name, seen, "synchronise the clock (chrony/NTP): S3 refuses requests "
                                "signed more than 15 minutes off")
    return warn(name, seen, "synchronise the clock (chrony/NTP): segment ages and the late "
                            "and lost segment timeouts are measured against S3's clock")


def s3_checks(bucket: BucketProbe, store: ObjectStore, settings: Settings, *,
              queue: tuple[str, str] | None = None) -> list[Check]:
    """Every S3 check of ``settings``: the bucket first (nothing else when it does not
    answer), versioning, the temp-object round trip on ``store`` (the same bucket; for an
    ingress-only config, which writes nothing, a listing of the source regions' prefixes
    instead), the clock and, with ``queue`` (name and ARN of ingress's queue), the
    notification to it.
    """
    try:
        head = bucket.head_bucket()
    except ReplicatorError as e:
        return [bucket_check(bucket.bucket, None, e)]
    out = [bucket_check(bucket.bucket, head, None)]
    try:
        out.append(versioning_check(bucket.bucket, bucket.versioning()))
    except ReplicatorError as e:
        out.append(warn("s3 versioning", f"not readable: {e}",
                        "grant s3:GetBucketVersioning to check it"))
    writer = settings.egress is not None or settings.compaction is not None
    prefixes = sorted({f"{settings.s3.prefix}/{s.region}/"
                       for s in (settings.ingress.sources if settings.ingress else [])})
    if writer or settings.ingress is None:
        out.append(temp_object_check(store, settings.s3.temp_prefix))
    else:
        out.append(list_check(store, prefixes))
    out.append(skew_check(head))
    if queue is not None and settings.ingress is not None:
        name, arn = queue
        try:
            out.append(notification_check(bucket.bucket, name, arn, prefixes,
                                          bucket.queue_notifications()))
        except ReplicatorError as e:
            out.append(warn("s3 notifications", f"not readable: {e}",
                            "grant s3:GetBucketNotification to check it"))
    return out
