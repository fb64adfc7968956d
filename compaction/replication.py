"""When may compaction delete the inputs of an output: once the output is safe in the
other region.

Deletes of small level-0 inputs replicate in seconds, a multi-GiB output takes longer, and
S3 does not order replication across keys: deleting the inputs as soon as the output exists
here could let the other region see the inputs vanish before the output arrives, a gap that
a lagging ingress may declare lost. So inputs are deleted only when ``head`` of the output
says it replicated (``COMPLETED``, or ``REPLICA`` on a bucket that is itself a replica).

* ``PENDING``: not yet; a later run looks again.
* ``FAILED``: S3 gave up and **never retries** the object, so waiting does not help: the
  other region never gets the output and its inputs stay here for ever. The verdict says
  ``failed``; the controller logs an ERROR naming the key and counts it
  (``replicator_compaction_replication_failed_total``) until someone re-drives the
  replication (docs/deploy.md, "S3 replication").
* No status at all (no replication rule, ``replicator sync``, moto): nothing tells when the
  other region has the output. Inputs are deleted only once the output is
  ``compaction.replication_grace`` old, and never while that setting is unset (the
  default): a guess must be configured, above the sync's lag, or ``0s`` where nothing
  replicates.

Inputs that must wait stay; a later run deletes them as leftovers covered by the output,
with the same check.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from replicator.core.storage import ObjectInfo

SAFE = frozenset({"COMPLETED", "REPLICA"})
FAILED = "FAILED"


class Verdict(NamedTuple):
    """Whether the inputs of an output may be deleted now."""

    delete: bool
    why: str
    """For the log and the run report."""
    failed: bool = False
    """S3 replication of the output FAILED: it will not happen without a re-drive."""


def replicated(output: ObjectInfo, now: datetime, grace: timedelta | None) -> Verdict:
    """Whether the inputs of ``output`` may be deleted now (``grace``: the setting
    ``compaction.replication_grace``, ``None`` when unset).
    """
    status = output.replication_status
    if status is not None:
        if status.upper() in SAFE:
            return Verdict(True, f"replication status {status}")
        return Verdict(False, f"replication status {status}", failed=status.upper() == FAILED)
    age = now - output.last_modified
    if grace is None:
        return Verdict(False, "no replication status, and compaction.replication_grace is "
                              "not set (set it above the lag of replicator sync, or to 0s "
                              "where nothing replicates)")
    if age >= grace:
        return Verdict(True, f"no replication status; written {age} ago (grace {grace})")
    return Verdict(False, f"no replication status; written {age} ago, grace {grace}")
