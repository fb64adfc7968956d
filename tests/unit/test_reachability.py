"""``DependencyWatch``: the gauge, the ERROR's rate and wording, recovery by itself; a
refusal counts as an answer."""

from __future__ import annotations

import logging

import pytest

from replicator.core.errors import StorageError, StorageFatalError
from replicator.core.metrics import Metrics
from replicator.core.reachability import Dependency, DependencyWatch

GAUGE = "replicator_dependency_unreachable"


class Flaky:
    def __init__(self) -> None:
        self.error: Exception | None = None

    def __call__(self) -> None:
        if self.error is not None:
            raise self.error


def test_one_error_when_it_stops_answering_then_at_most_one_a_minute_and_back_by_itself(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    s3, sqs = Flaky(), Flaky()
    m = Metrics()
    watch = DependencyWatch([Dependency("s3", "http://h:9000 (bucket b)", s3),
                             Dependency("sqs", "http://h:9000 (queue q)", sqs)], m,
                            service="ingress", clock=lambda: now[0])
    assert watch.reachable and m.value(GAUGE, {"dependency": "s3"}) == 0
    s3.error = StorageError("connect to http://h:9000 failed: connection refused")
    with caplog.at_level(logging.INFO, "replicator.core.reachability"):
        for t in range(0, 130, 5):          # a probe every 5 s for two minutes
            now[0] = float(t)
            watch.check()
        assert watch.unreachable == ["s3"] and not watch.reachable
        assert m.value(GAUGE, {"dependency": "s3"}) == 1
        assert m.value(GAUGE, {"dependency": "sqs"}) == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert errors == [
            "cannot reach S3 at http://h:9000 (bucket b): connect to http://h:9000 failed: "
            "connection refused; ingress /readyz is false, asking again every 5s",
            "cannot reach S3 at http://h:9000 (bucket b) for 60s: connect to http://h:9000 "
            "failed: connection refused; ingress /readyz is false, asking again every 5s",
            "cannot reach S3 at http://h:9000 (bucket b) for 120s: connect to http://h:9000 "
            "failed: connection refused; ingress /readyz is false, asking again every 5s"]
        s3.error = None
        now[0] = 130.0
        watch.check()
    assert watch.reachable and m.value(GAUGE, {"dependency": "s3"}) == 0
    assert caplog.records[-1].getMessage().startswith(
        "reached S3 at http://h:9000 (bucket b) again after 130s")


def test_a_refusal_is_an_answer() -> None:
    probe = Flaky()
    probe.error = StorageFatalError("access denied")
    watch = DependencyWatch([Dependency("s3", "x", probe)], Metrics(), service="egress")
    watch.check()
    assert watch.reachable
