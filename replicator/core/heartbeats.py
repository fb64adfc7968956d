"""Reading egress heartbeats from a bucket (``{prefix}/{region}/{topic}/_heartbeats/``;
docs/architecture.md, "Heartbeats"): ingress and ``replicator topics`` read them.
"""

from __future__ import annotations

import logging

from replicator.core.errors import ObjectNotFound, ReplicatorError
from replicator.core.keys import heartbeats_prefix, parse_heartbeat_key
from replicator.core.storage import ObjectStore
from replicator.core.wire import Heartbeat

log = logging.getLogger(__name__)


def read_heartbeats(store: ObjectStore, prefix: str, region: str, topic: str
                    ) -> list[Heartbeat]:
    """Every heartbeat object of one source topic (unreadable ones are logged, skipped).

    Raises:
        ReplicatorError: the listing failed.
    """
    out = []
    for info in store.list(heartbeats_prefix(prefix, region, topic)):
        if parse_heartbeat_key(info.key) is None:
            continue
        try:
            out.append(Heartbeat.parse(store.get(info.key), where=info.key))
        except ObjectNotFound:
            continue   # deleted since the listing (a lifecycle rule, an operator)
        except (ValueError, ReplicatorError) as e:
            log.warning("heartbeat %s cannot be read: %s", info.key, e)
    return out
