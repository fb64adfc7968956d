"""``replicator demo`` from the command line: it must end with PASS and exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from replicator.core.processes import process_cmdline


def embedded_servers() -> set[int]:
    """PIDs of running Tansu brokers and moto servers."""
    return {int(pid) for pid in os.listdir("/proc") if pid.isdigit()
            and re.search(r"tansu|moto_server|moto\.server", process_cmdline(int(pid)))}


@pytest.mark.timeout(420)
def test_demo_passes_and_leaves_nothing_running(tmp_path: Path) -> None:
    before = embedded_servers()
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "SPARK_LOCAL_IP": "127.0.0.1"}
    exe = Path(sys.executable).parent / "replicator"
    proc = subprocess.run(
        [str(exe), "demo", "--records", "20000", "--partitions", "3", "--value-size", "200",
         "--dir", str(tmp_path / "stack")],
        check=False, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert out.rstrip().endswith("PASS")
    m = re.search(r"verify: source ([\d,]+) records, destination ([\d,]+); lost (\d+), "
                  r"duplicated (\d+), reordered (\d+)", out)
    assert m is not None, out
    assert m.group(1) == m.group(2) == "20,000"
    assert m.groups()[2:] == ("0", "0", "0")
    # Compaction merged the level-0 segments into level 1.
    assert re.search(r"after L1: \d+", out), out
    # The demo started its own stack and stopped it: none of its servers is left.
    assert "starting the embedded stack" in out
    assert embedded_servers() <= before
