"""``replicator-egress`` started while its brokers are down: one clear ERROR per attempt
naming the broker and the reason, no "egress started" before the cluster answered,
librdkafka's own connection lines once (not several a second), and SIGTERM still stops it
(the pieces: tests/unit/test_cli_start.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from replicator.devstack.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_egress_waits_for_unreachable_brokers_with_one_clear_line(
        moto_endpoint: str, bucket: str, tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "egress.toml"
    cfg.write_text(f'''region = "us-east-1"
[s3]
bucket = "{bucket}"
endpoint_url = "{moto_endpoint}"
access_key_id = "test"
secret_access_key = "test"
[kafka]
brokers = "127.0.0.1:{port}"
[metrics]
port = 0
[egress]
topics = {{ "sensor.events" = {{}} }}
''')
    log = tmp_path / "egress.log"
    with log.open("w") as out:
        # From the checkout (cwd first on sys.path), as the console script would run it.
        proc = subprocess.Popen(
            [sys.executable, "-c", "from replicator.cli.egress import main; main()",
             "--config", str(cfg)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("cannot reach Kafka") < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    lines = text.splitlines()
    ours = [x for x in lines if "cannot reach Kafka" in x]
    assert all(" ERROR " in x and f"at 127.0.0.1:{port}: Connect to ipv4#127.0.0.1:{port} "
               "failed: Connection refused; egress not started, retrying every 5s" in x
               for x in ours), ours
    # About 5 s apart: the first two of them took one retry interval.
    assert 2 <= len(ours) <= 3, ours
    client = [x for x in lines if " librdkafka: " in x]
    assert len(client) <= 1, client
    assert "egress started" not in text
    assert "egress stopped before it reached Kafka" in text
