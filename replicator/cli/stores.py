"""Building object stores and Kafka settings from operator-command options."""

from __future__ import annotations

from pathlib import Path

from replicator.cli.common import load_or_exit
from replicator.core.s3 import S3ObjectStore, make_s3_client
from replicator.core.settings import Settings


def store_for(bucket: str, *, endpoint_url: str | None, region: str,
              settings: Settings | None = None) -> S3ObjectStore:
    """An S3 store for ``bucket``; credentials from ``settings.s3`` or the AWS chain.

    Server-side encryption (``s3.sse``, ``s3.sse_kms_key_id``) is configured per bucket, so
    it applies to writes into ``bucket`` only when ``bucket`` is the settings' own bucket;
    writes into another bucket get that bucket's default encryption.
    """
    key, secret = settings.s3.static_keys() if settings is not None else (None, None)
    client = make_s3_client(endpoint_url=endpoint_url, region=region, access_key_id=key,
                            secret_access_key=secret)
    own = settings is not None and settings.s3.bucket == bucket
    return S3ObjectStore(client, bucket,
                         sse=settings.s3.sse if own and settings is not None else None,
                         sse_kms_key_id=(settings.s3.sse_kms_key_id
                                         if own and settings is not None else None))


def settings_store(config: Path, bucket: str | None = None) -> tuple[Settings, S3ObjectStore]:
    """Settings from ``config`` and a store for its bucket (or ``bucket``)."""
    settings = load_or_exit(config)
    if bucket is None:
        return settings, S3ObjectStore.from_settings(settings)
    return settings, store_for(bucket, endpoint_url=settings.s3.endpoint_url,
                               region=settings.s3_region, settings=settings)
