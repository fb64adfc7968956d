"""The chaos harness's own decisions (no servers): duplicate runs and their classification,
fault picking, and the proxy against a tiny upstream."""

from __future__ import annotations

import http.client
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.chaos.fault_proxy import FaultProfile, FaultProxy, Trigger
from tests.chaos.harness import duplicate_runs, missing_ranges, split_duplicates

SRC = [bytes([i]) for i in range(20)]


def test_an_aborted_transaction_repeated_is_transaction_shaped() -> None:
    # Offsets 10-14 visible twice (aborted on Kafka, visible on Tansu), checkpoint at 9.
    dst = SRC[:15] + SRC[10:]
    runs = duplicate_runs(SRC, dst)
    assert runs.runs == [(10, 14)]
    assert split_duplicates(runs, [4, 9, 14, 19], batch_size=5) == (5, 0)


def test_a_repeat_not_after_a_checkpoint_or_longer_than_a_batch_is_real() -> None:
    dst = SRC[:15] + SRC[12:]                       # starts mid-transaction
    assert split_duplicates(duplicate_runs(SRC, dst), [4, 9, 14, 19], 5) == (0, 3)
    dst = SRC[:15] + SRC[5:]                        # two transactions again: 10 > batch 5
    assert split_duplicates(duplicate_runs(SRC, dst), [4, 9, 14, 19], 5) == (0, 10)


def test_missing_ranges() -> None:
    assert missing_ranges(SRC, SRC[:3] + SRC[6:10] + SRC[11:]) == [(3, 5), (10, 10)]
    assert missing_ranges(SRC, SRC) == []


def test_fault_profile_rates() -> None:
    rnd = random.Random(1)
    profile = FaultProfile({"error500": 0.2, "reset": 0.1})
    picks = [profile.pick(rnd) for _ in range(10_000)]
    assert 0.17 < picks.count("error500") / 10_000 < 0.23
    assert 0.08 < picks.count("reset") / 10_000 < 0.12
    assert FaultProfile().pick(rnd) is None


def test_proxy_forwards_injects_and_fires_triggers() -> None:
    hits: list[str] = []

    class Upstream(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def do_PUT(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            hits.append(self.path + ":" + self.rfile.read(n).decode())
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proxy = FaultProxy("127.0.0.1", upstream.server_address[1]).start()
    try:
        port = int(proxy.address.rsplit(":", 1)[1])

        def put(path: str) -> tuple[int, bytes] | None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                c.request("PUT", path, body=b"x")
                r = c.getresponse()
                return r.status, r.read()
            except (ConnectionError, http.client.HTTPException):
                return None
            finally:
                c.close()

        assert put("/b/k") == (200, b"ok")
        proxy.configure(FaultProfile({"slowdown": 1.0}), 0)
        status = put("/b/k2")
        assert status is not None and status[0] == 503 and b"SlowDown" in status[1]
        proxy.configure(FaultProfile({"lost_reply": 1.0}), 0)
        r = put("/b/k3")
        assert r is None or r[0] == 500            # the client never sees the 200 ...
        assert "/b/k3:x" in hits                   # ... but the request took effect
        proxy.configure(FaultProfile(), 0)
        fired: list[bool] = []
        proxy.arm(Trigger("PUT", "/b/temp/", lambda: fired.append(True)))
        assert put("/b/data/x") == (200, b"ok")    # does not match: forwarded
        assert put("/b/temp/y") is None            # matches: action, reset, not forwarded
        assert fired == [True] and "/b/temp/y:x" not in hits
        assert proxy.take_counts() == {"slowdown": 1, "lost_reply": 1}
    finally:
        proxy.close()
        upstream.shutdown()
        upstream.server_close()
