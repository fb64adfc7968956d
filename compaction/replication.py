"""When may compaction delete the inputs of an output: once the output is safe in the
other region.

Deletes of small level-0 inputs replicate in seconds, a multi-GiB output takes longer, and
S3 does not order replication across keys: deleting the inputs as soon as the output exists
here could let the other region see the inputs vanish before the output arrives, a gap that
a lagging ingress may declare lost. So inputs are deleted only when ``head`` of the output
says it replicated (``COMPLETED``, or ``REPLICA`` on a bucket that is itself a replica). A
store that reports no replication status (no replication rule, ``replicator sync``, moto)
is given ``compaction.replication_grace`` from the output's last modification instead.
Inputs that must wait stay; a later run deletes them as leftovers covered by the output,
with the same check.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from replicator.core.storage import ObjectInfo

SAFE = frozenset({"COMPLETED", "REPLICA"})


def replicated(output: ObjectInfo, now: datetime, grace: timedelta) -> tuple[bool, str]:
    """Whether the inputs of ``output`` may be deleted now, and why (for the log)."""
    status = output.replication_status
    if status is not None:
        if status.upper() in SAFE:
            return True, f"replication status {status}"
        return False, f"replication status {status}"
    age = now - output.last_modified
    if age >= grace:
        return True, f"no replication status; written {age} ago (grace {grace})"
    return False, f"no replication status; written {age} ago, grace {grace}"
