"""The cost per GB of the peer benchmark (bench/cost.py): operations from moto's log, prices."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import cost

LOG = """\
 * Running on http://127.0.0.1:1234
127.0.0.1 - - [23/Nov/2026 08:57:49] "PUT /src HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "PUT /src/temp/x HTTP/1.1" 200 -
127.0.0.1 "PUT /src/data/r/t/0/0/00000000000000000000-00000000000000000009 HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "PUT /src/data/r/t/_topic.json HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "PUT /src/data/t/0/b?partNumber=1&uploadId=u HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "PUT /dst/data/t/0/a HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "HEAD /src/temp/x HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "\x1b[35m\x1b[1mDELETE /src/temp/x HTTP/1.1\x1b[0m" 204 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "GET /dst/data/t/0/a HTTP/1.1" 206 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "GET /src?list-type=2&prefix=data/ HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "POST /src?delete HTTP/1.1" 200 -
127.0.0.1 - - [23/Nov/2026 08:57:49] "POST / HTTP/1.1" 200 -
"""


def test_operations_tell_copies_from_puts_by_the_final_prefix() -> None:
    ops = cost.count_operations(LOG.splitlines(), copy_prefixes=("/src/data/",))
    assert ops == {"other": 1, "PUT": 4, "COPY": 1, "HEAD": 1, "DELETE": 2, "GET": 1,
                   "LIST": 1, "SQS": 1}
    assert cost.count_operations(LOG.splitlines())["COPY"] == 0


def test_cost_per_gb_prices_each_item_with_the_table() -> None:
    prices = dict(cost.PRICES)
    c = cost.cost_per_gb(source_bytes=0.5e9, cpu_s=36.0, requests={"PUT": 2, "COPY": 1,
                                                                    "GET": 4, "SQS": 10},
                         stored_bytes=0.25e9, cross_region_bytes=0.25e9, prices=prices)
    assert c["cpu_s_per_gb"] == 72.0 and c["requests_per_gb"]["PUT"] == 4.0
    usd = c["usd_per_gb"]
    assert usd["compute"] == pytest.approx(72 / 3600 * prices["vcpu_hour"])
    assert usd["s3_requests"] == pytest.approx(6 / 1000 * prices["s3_put_per_1000"]
                                               + 8 / 1000 * prices["s3_get_per_1000"])
    assert usd["sqs"] == pytest.approx(20 / 1e6 * prices["sqs_per_million"])
    assert usd["storage_month"] == pytest.approx(0.5 * prices["s3_storage_gb_month"])
    assert usd["transfer"] == pytest.approx(0.5 * prices["transfer_gb"])
    assert c["usd_per_gb_total"] == pytest.approx(sum(usd.values()))


def test_prices_file_replaces_keys_and_rejects_unknown_ones(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text("transfer_gb = 0.09\n")
    assert cost.load_prices(f)["transfer_gb"] == 0.09
    assert cost.load_prices(f)["vcpu_hour"] == cost.PRICES["vcpu_hour"]
    f.write_text("egress_gb = 1\n")
    with pytest.raises(SystemExit, match="egress_gb"):
        cost.load_prices(f)


def test_log_bytes_sums_the_topics_segment_files(tmp_path: Path) -> None:
    for d, size in (("t-0", 10), ("t-1", 5), ("t-x-0", 100)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "00000000000000000000.log").write_bytes(b"x" * size)
        (tmp_path / d / "00000000000000000000.index").write_bytes(b"x" * 1000)
    assert cost.log_bytes(tmp_path, "t") == 15


def test_request_cost_is_the_request_items_of_the_cost_per_gb() -> None:
    ops = cost.count_operations(LOG.splitlines(), copy_prefixes=("/src/data/",))
    c = cost.request_cost_per_gb(ops, 0.5e9, cost.PRICES)
    assert (c["put_class_per_gb"], c["get_class_per_gb"]) == (12.0, 4.0)   # PUT COPY LIST; GET HEAD
    assert (c["sqs_per_gb"], c["delete_per_gb"]) == (2.0, 4.0)
    full = cost.cost_per_gb(source_bytes=0.5e9, cpu_s=1.0, requests=ops, stored_bytes=1.0,
                            cross_region_bytes=1.0, prices=cost.PRICES)["usd_per_gb"]
    assert c["usd_per_gb"] == pytest.approx(full["s3_requests"] + full["sqs"])
