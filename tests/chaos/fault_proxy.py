"""A fault-injecting HTTP proxy in front of moto (S3).

The processes under test point ``s3.endpoint_url`` at the proxy. Every request is either
forwarded unchanged or answered with a fault chosen by the current ``FaultProfile``:

* ``error500`` / ``slowdown``: an S3 XML error (500 InternalError, 503 SlowDown), the request
  never reaches moto;
* ``reset``: the connection is reset (RST) before anything is forwarded;
* ``stall``: the proxy holds the request for ``stall_seconds`` and then resets the
  connection (a hung server; the clients' 60 s read timeout is too long for a test budget);
* ``slow``: forwarded after ``slow_seconds`` of delay;
* ``lost_reply`` (the hard case): the request IS forwarded and executed by moto, but the
  client sees a reset or a 500 instead of the answer, so its retry meets the effect of its
  own first attempt (a completed upload, an existing key, a deleted object).

``outage`` windows make every request fail (503 SlowDown) for a while, so the suite's own
retry layers run out of botocore's in-call retries and must cope above them.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailers", "transfer-encoding", "upgrade"})

KINDS = ("error500", "slowdown", "reset", "stall", "slow", "lost_reply")


@dataclass(frozen=True)
class FaultProfile:
    """Per-request fault probabilities (each in 0..1; their sum must stay below 1)."""

    rates: dict[str, float] = field(default_factory=dict)
    stall_seconds: float = 2.0
    slow_seconds: float = 0.5

    def pick(self, rnd: random.Random) -> str | None:
        roll = rnd.random()
        acc = 0.0
        for kind in KINDS:
            acc += self.rates.get(kind, 0.0)
            if roll < acc:
                return kind
        return None


NO_FAULTS = FaultProfile()


@dataclass
class Trigger:
    """A one-shot action at a matching request (e.g. SIGKILL egress at its next copy).

    ``after_forward``: the request reaches moto first (it takes effect), then the action
    runs and the client's connection is reset; otherwise the action runs and the request
    never arrives.
    """

    method: str
    path_contains: str
    action: Callable[[], None]
    after_forward: bool = False
    header: str | None = None
    fired: bool = False

    def matches(self, method: str, path: str, headers: Any) -> bool:
        if method != self.method or self.path_contains not in path:
            return False
        return self.header is None or self.header in headers


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients reset connections on purpose here (timeouts, SIGKILLed processes).
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def s3_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>chaos</RequestId></Error>").encode()


class FaultProxy:
    """The proxy server; ``address`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, upstream_host: str, upstream_port: int, *, seed: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.profile = NO_FAULTS
        self._outage_until = 0.0
        self._rnd = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self._trigger: Trigger | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return  # one line per request would drown the test output

            def do_GET(self) -> None:
                proxy._handle(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy",
                                        daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def configure(self, profile: FaultProfile, seed: int) -> None:
        with self._lock:
            self.profile = profile
            self._rnd = random.Random(seed)

    def outage(self, seconds: float) -> None:
        """Answer every request with 503 SlowDown for ``seconds``."""
        with self._lock:
            self._outage_until = time.monotonic() + seconds

    def arm(self, trigger: Trigger) -> None:
        """Run ``trigger.action`` once, at the next request ``trigger.matches``."""
        with self._lock:
            self._trigger = trigger

    def disarm(self) -> Trigger | None:
        with self._lock:
            t, self._trigger = self._trigger, None
            return t

    def _take_trigger(self, h: BaseHTTPRequestHandler) -> Trigger | None:
        with self._lock:
            t = self._trigger
            if t is None or not t.matches(h.command, h.path, h.headers):
                return None
            self._trigger = None
            return t

    def take_counts(self) -> Counter[str]:
        with self._lock:
            c = self.injected
            self.injected = Counter()
            return c

    # --- one request ------------------------------------------------------------------

    def _decide(self) -> tuple[str | None, FaultProfile]:
        with self._lock:
            self.requests += 1
            if time.monotonic() < self._outage_until:
                self.injected["outage"] += 1
                return "outage", self.profile
            kind = self.profile.pick(self._rnd)
            if kind is not None:
                self.injected[kind] += 1
            return kind, self.profile

    def _handle(self, h: BaseHTTPRequestHandler) -> None:  # noqa: C901 - one case per fault
        body = _read_body(h)
        trigger = self._take_trigger(h)
        if trigger is not None:
            if trigger.after_forward:
                try:
                    self._forward(h, body)
                except OSError:
                    pass  # the kill matters, not the answer
            trigger.action()
            trigger.fired = True
            _reset(h)
            return
        kind, profile = self._decide()
        if kind == "reset":
            _reset(h)
            return
        if kind == "stall":
            time.sleep(profile.stall_seconds)
            _reset(h)
            return
        if kind in ("error500", "slowdown", "outage"):
            status, code = (500, "InternalError") if kind == "error500" else (503, "SlowDown")
            _reply(h, status, {"Content-Type": "application/xml"},
                   s3_error(code, "injected by the chaos proxy"))
            return
        if kind == "slow":
            time.sleep(profile.slow_seconds)
        try:
            status, headers, payload = self._forward(h, body)
        except OSError:
            _reset(h)
            return
        if kind == "lost_reply":
            # The request took effect upstream; the client never learns it.
            if self._rnd.random() < 0.5:
                _reset(h)
            else:
                _reply(h, 500, {"Content-Type": "application/xml"},
                       s3_error("InternalError", "reply lost by the chaos proxy"))
            return
        _reply(h, status, headers, payload, head=h.command == "HEAD")

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
            if body or h.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, [(k, v) for k, v in resp.getheaders()
                                 if k.lower() not in HOP_BY_HOP], payload
        finally:
            conn.close()


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else b""


def _reply(h: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]] | dict[str, str],
           payload: bytes, *, head: bool = False) -> None:
    items = headers.items() if isinstance(headers, dict) else headers
    h.send_response_only(status)
    length_sent = False
    for k, v in items:
        if k.lower() == "content-length":
            if head:
                h.send_header(k, v)
                length_sent = True
            continue
        h.send_header(k, v)
    if not length_sent:
        h.send_header("Content-Length", str(len(payload)))
    h.end_headers()
    if not head:
        h.wfile.write(payload)
    h.wfile.flush()


def _reset(h: BaseHTTPRequestHandler) -> None:
    """Close the client connection with a TCP RST (SO_LINGER 0)."""
    sock: socket.socket = h.connection
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass  # already gone: the client hung up first
    h.close_connection = True
