"""The cost per GB of source records, priced with a price table a user can change.

``PRICES`` are AWS on-demand list prices (us-east-1, November 2026, rounded); edit them, or
pass ``--prices FILE.toml`` to ``peer_mm2.py`` with the same keys, to price another region
or a discount. Everything is per GB (10^9 bytes) of *source records* (key + value bytes as
produced), so rows of different record sizes and systems compare directly.

What is counted (``peer_mm2.py`` measures it in the same run for MirrorMaker 2 and ours):

* ``cpu_s``: CPU-seconds of the replicating processes (all threads; the brokers apart),
  priced as vCPU time (``vcpu_hour``).
* S3 requests by operation (PUT, COPY, LIST, GET, HEAD, DELETE) from moto's request log,
  priced by billing class (PUT/COPY/POST/LIST at ``s3_put_per_1000``, GET/HEAD at
  ``s3_get_per_1000``, DELETE free), and SQS requests (``sqs_per_million``).
* ``stored_bytes``: bytes of the segments in S3, priced for one month
  (``s3_storage_gb_month``; keep fewer or more months by scaling it).
* ``cross_region_bytes``: bytes that cross the regions, at ``transfer_gb``. Ours: the
  replicated segment objects (S3 Replication or ``replicator sync`` copies each once).
  MirrorMaker 2 runs in the destination region and fetches from the source brokers: the
  bytes of the source partitions' log files (the record batches as stored and fetched;
  fetch-response framing is left out, so this is a lower bound).
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

GB = 1e9

PRICES: dict[str, float] = {
    "vcpu_hour": 0.1008 / 2,       # m7i.large on-demand (2 vCPU), per vCPU
    "s3_put_per_1000": 0.005,      # PUT, COPY, POST, LIST (S3 Standard)
    "s3_get_per_1000": 0.0004,     # GET, HEAD, and all other requests
    "s3_storage_gb_month": 0.023,  # S3 Standard, first 50 TB
    "sqs_per_million": 0.40,       # standard queue, beyond the free tier
    "transfer_gb": 0.02,           # inter-region data transfer out, US regions
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP/[\d.]+"\s+(\d{3})')
_SEGMENT_NAME = re.compile(r"\d{20}-\d{20}")
"""The last part of a segment key (``replicator.core.keys.SegmentKey``); topic metadata
and heartbeats under the same prefix are PUT."""
OPERATIONS = ("PUT", "COPY", "LIST", "GET", "HEAD", "DELETE", "SQS", "other")
PUT_CLASS = ("PUT", "COPY", "LIST")
GET_CLASS = ("GET", "HEAD")


def load_prices(path: Path | None) -> dict[str, float]:
    """``PRICES`` with the keys of a TOML file (flat ``key = number``) replacing them."""
    prices = dict(PRICES)
    if path is not None:
        extra = tomllib.loads(path.read_text())
        unknown = set(extra) - set(PRICES)
        if unknown:
            raise SystemExit(f"{path}: unknown price keys {sorted(unknown)}")
        prices.update({k: float(v) for k, v in extra.items()})
    return prices


def classify(method: str, target: str, copy: bool = False) -> str:
    """The operation of one request in moto's access log (``OPERATIONS``).

    moto serves SQS at ``/``. A PUT carrying ``x-amz-copy-source`` is a COPY, which the
    access log does not show: ``copy`` says so when the caller knows (``replicator sync``
    and egress's finish are copies; see ``count_operations``).
    """
    path, _, query = target.partition("?")
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "SQS"
    if method == "DELETE" or (method == "POST" and "delete" in query.split("&")):
        return "DELETE"
    if len(parts) == 1:   # bucket level
        if method == "GET" and ("list-type" in query or query == "" or "prefix=" in query):
            return "LIST"
        return "other"
    if method in ("PUT", "POST"):
        return "COPY" if copy else "PUT"
    if method == "GET":
        return "GET"
    if method == "HEAD":
        return "HEAD"
    return "other"


def count_operations(lines: Iterable[str], copy_prefixes: tuple[str, ...] = ()
                     ) -> Counter[str]:
    """Requests by operation in moto's werkzeug access log.

    The access log has no headers, so a COPY (PUT with ``x-amz-copy-source``) is told
    from a PUT by its target: a whole-object PUT (no query) whose path starts with one of
    ``copy_prefixes`` and whose name is a segment's is a COPY (egress writes ``temp/`` and
    copies to the final key under ``data/``). Both are PUT-class, priced alike.
    """
    out: Counter[str] = Counter()
    for line in lines:
        m = _REQUEST.search(_ANSI.sub("", line))
        if m is not None:
            method, target = m.group(1), m.group(2)
            copy = (method == "PUT" and "?" not in target and target.startswith(copy_prefixes)
                    and _SEGMENT_NAME.fullmatch(target.rsplit("/", 1)[-1]) is not None)
            out[classify(method, target, copy)] += 1
    return out


def cost_per_gb(*, source_bytes: float, cpu_s: float, requests: Mapping[str, int],
                stored_bytes: float, cross_region_bytes: float,
                prices: Mapping[str, float]) -> dict[str, Any]:
    """Quantities and dollars per GB of source records, by item and in total."""
    per_gb = GB / source_bytes
    req = {op: requests.get(op, 0) * per_gb for op in OPERATIONS}
    put = sum(req[o] for o in PUT_CLASS)
    get = sum(req[o] for o in GET_CLASS)
    usd = {
        "compute": cpu_s * per_gb / 3600 * prices["vcpu_hour"],
        "s3_requests": put / 1000 * prices["s3_put_per_1000"]
        + get / 1000 * prices["s3_get_per_1000"],
        "sqs": req["SQS"] / 1e6 * prices["sqs_per_million"],
        "storage_month": stored_bytes * per_gb / GB * prices["s3_storage_gb_month"],
        "transfer": cross_region_bytes * per_gb / GB * prices["transfer_gb"],
    }
    return {"cpu_s_per_gb": cpu_s * per_gb,
            "requests_per_gb": req,
            "stored_gb_per_gb": stored_bytes / source_bytes,
            "cross_region_gb_per_gb": cross_region_bytes / source_bytes,
            "usd_per_gb": usd, "usd_per_gb_total": sum(usd.values())}


def request_cost_per_gb(requests: Mapping[str, int], source_bytes: float,
                        prices: Mapping[str, float]) -> dict[str, float]:
    """S3 and SQS requests per GB of source records by billing class, and their price
    (``cost_per_gb``'s request items alone: the latency stage has no CPU or storage figure).
    """
    c = cost_per_gb(source_bytes=source_bytes, cpu_s=0.0, requests=requests, stored_bytes=0.0,
                    cross_region_bytes=0.0, prices=prices)
    req, usd = c["requests_per_gb"], c["usd_per_gb"]
    return {"put_class_per_gb": sum(req[o] for o in PUT_CLASS),
            "get_class_per_gb": sum(req[o] for o in GET_CLASS),
            "sqs_per_gb": req["SQS"], "delete_per_gb": req["DELETE"],
            "usd_per_gb": usd["s3_requests"] + usd["sqs"]}


def log_bytes(data_dir: Path, topic: str) -> int:
    """Bytes of a topic's record batches in a broker's log dirs (``*.log`` segment files)."""
    return sum(f.stat().st_size for d in data_dir.glob(f"{topic}-*") if d.is_dir()
               and d.name[len(topic) + 1:].isdigit() for f in d.glob("*.log"))
