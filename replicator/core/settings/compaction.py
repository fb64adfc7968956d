"""The ``[compaction]`` section and its per-topic ``[compaction.topics."name"]`` tables.

Separate from the ``[egress]`` and ``[ingress]`` sections (``egress.py``, ``ingress.py``):
each service reads only its own section.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field, field_validator, model_validator

from replicator.core.settings.fields import Duration, Model, Size, at_least
from replicator.core.settings.names import topic_name


class CompactionTopicSettings(Model):
    """Compaction thresholds of one topic (``[compaction.topics."name"]``)."""

    min_level: int = Field(0, ge=0, description="Lowest input level.")
    max_level: int = Field(0, ge=0, description="Highest input level.")
    min_segment_age: Duration = Field(timedelta(hours=1), description="Only older inputs.")
    min_segment_count: int = Field(10, ge=1, description="Skip runs with fewer inputs.")
    min_segment_size: Size = Field(1024**3, description="Skip runs with fewer bytes.")
    max_segment_count: int = Field(1000, ge=1, description="Inputs per output, at most.")
    max_segment_size: Size = Field(4 * 1024**3, description="Bytes per output, at most.")
    batch_size: int = Field(10_000, ge=1, description="Records per streamed batch.")
    delete: bool = Field(True, description="Delete inputs after the output is durable.")

    @model_validator(mode="after")
    def _combination_ok(self) -> CompactionTopicSettings:
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) > max_level ({self.max_level})")
        if self.min_segment_count > self.max_segment_count:
            raise ValueError(f"min_segment_count ({self.min_segment_count}) > "
                             f"max_segment_count ({self.max_segment_count})")
        if self.min_segment_size > self.max_segment_size:
            raise ValueError(f"min_segment_size ({self.min_segment_size}) > "
                             f"max_segment_size ({self.max_segment_size})")
        return self


class CompactionSettings(Model):
    """The compaction job (``[compaction]``)."""

    schedule: str = Field("0 1 * * *", description="Cron: 5 fields, or 6 fields seconds-first.")
    parallelism: int = Field(8, ge=1, description="Merge tasks run at once.")
    spark_master: str = Field(
        "local[*]", description="Spark master URL (local[*], spark://..., k8s://...); "
                                "\"inline\" merges in this process without Spark; \"\" "
                                "takes the master from spark-submit.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")
    lock_ttl: Duration = Field(timedelta(hours=2),
                               description="Expiry of the region lock (at least 1s).")
    replication_grace: Duration | None = Field(
        None, description="Inputs are deleted once their output replicated (S3 "
        "replication status COMPLETED; FAILED is an ERROR and the inputs stay until the "
        "replication is re-driven, docs/deploy.md). On a store that reports no status "
        "(replicator sync, no replication rule), once the output is this old; unset, such "
        "inputs are never deleted. Set it above the sync's lag, or to \"0s\" where nothing "
        "replicates.")
    topics: dict[str, CompactionTopicSettings] = Field(description="Topics to compact.")

    @field_validator("lock_ttl")
    @classmethod
    def _lock_ttl_ok(cls, v: timedelta) -> timedelta:
        return at_least(v, timedelta(seconds=1), "a lock born expired locks nothing")

    @field_validator("schedule")
    @classmethod
    def _cron_ok(cls, v: str) -> str:
        from replicator.core.cron import parse_cron  # local: croniter only when validating

        parse_cron(v)
        return v

    @field_validator("topics")
    @classmethod
    def _topics_ok(cls, v: dict[str, CompactionTopicSettings]) -> dict[str, Any]:
        for t in v:
            topic_name(t)
        return v

