"""``replicator failback record-start`` on Apache Kafka: the first offset the DR region writes
per destination partition, saved in the format ``kafka-consumer-groups.sh --reset-offsets
--from-file`` reads (and that tool, run on the file, commits exactly those offsets); refused
while ingress has members or a transaction is open (the end can still move).

Cost: 6.5 s measured (one kafka-consumer-groups.sh JVM), load average 10 on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli.main import main
from replicator.core.kafka import Admin, Consumer, Producer
from tests.conftest import unique_name
from tests.integration.pipeline import Pipeline, wait_for

pytestmark = pytest.mark.apache


def _config(pipe: Pipeline, tmp_path: Path) -> Path:
    return pipe.ingress_config_file(tmp_path, destination_topic=pipe.dest_topic,
                                    group_id=pipe.ingress_group)


def test_the_first_dr_offsets_are_recorded_and_reset_offsets_reads_them(
        pipe: Pipeline, tmp_path: Path) -> None:
    assert Admin(pipe.dest_kafka).create_topic(pipe.dest_topic, 2)
    # What ingress replicated: transactions (each ends with a marker).
    tx = Producer(pipe.dest_kafka, transactional_id=unique_name("tx"))
    tx.init_transactions(30)
    tx.begin_transaction()
    for i in range(5):
        tx.produce(pipe.dest_topic, f"r{i}".encode(), partition=0)
    for i in range(3):
        tx.produce(pipe.dest_topic, f"s{i}".encode(), partition=1)
    tx.commit_transaction(30)
    config = _config(pipe, tmp_path)
    saved = tmp_path / "first-dr-offsets.csv"
    args = ["failback", "record-start", "--config", str(config), "--save", str(saved)]

    # Ingress still running: its next records would follow the recorded offsets.
    member = Consumer(pipe.dest_kafka, pipe.ingress_group)
    member.subscribe([pipe.dest_topic])
    try:
        wait_for(lambda: (member.poll(0.2), bool(member.assignment()))[1], 30, "a member")
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 1 and "1 member(s)" in refused.output, refused.output
    finally:
        member.close()
    assert not saved.exists()

    # A transaction still open (an ingress killed mid-batch): refused until it ends.
    tx.begin_transaction()
    tx.produce(pipe.dest_topic, b"open", partition=0)
    tx.flush(30)
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and "open transaction" in refused.output, refused.output
    tx.abort_transaction(30)

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    # 5 records + marker, an aborted record + marker; 3 records + marker.
    assert saved.read_text() == f"{pipe.dest_topic},0,8\n{pipe.dest_topic},1,4\n"
    assert "first DR offset" in result.output

    group = unique_name("failback")
    tool = Path(os.environ["KAFKA_HOME"]) / "bin" / "kafka-consumer-groups.sh"
    done = subprocess.run([str(tool), "--bootstrap-server", pipe.dest_brokers, "--group", group,
                           "--reset-offsets", "--from-file", str(saved), "--execute"],
                          check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KAFKA_HEAP_OPTS": "-Xmx128m"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert Admin(pipe.dest_kafka).group_offsets(group) == {(pipe.dest_topic, 0): 8,
                                                           (pipe.dest_topic, 1): 4}
