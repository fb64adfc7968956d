"""``replicator doctor``: everything a region's config depends on, checked before a service
starts (docs/operator-commands.md).

One module per dependency (``kafka``, ``s3``, ``sqs``, ``compaction``, and ``sources``:
ingress's sources in the bucket against their destination topics); each has pure
decision functions that map what was seen to a ``Check`` (PASS/WARN/FAIL, what was seen, the
fix) and one function that reads the dependency through its seam and calls them.
``report`` has the ``Check`` type and the exit code.
"""

from __future__ import annotations

from replicator.ops.doctor.report import Check, Status, exit_code, overall

__all__ = ["Check", "Status", "exit_code", "overall"]
