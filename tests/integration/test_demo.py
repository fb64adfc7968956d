"""``replicator demo`` from the command line: it must end with PASS and exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def processes_writing_into(directory: Path) -> set[int]:
    """PIDs whose standard output goes to a file under ``directory`` (the stack's server
    logs): the demo's own servers, whatever else runs on the shared machine."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            target = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            out.add(int(pid))
    return out


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kafka", [pytest.param("tansu", marks=pytest.mark.tansu),
                                   pytest.param("apache", marks=pytest.mark.apache)])
def test_demo_passes_and_leaves_nothing_running(tmp_path: Path, kafka: str) -> None:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "SPARK_LOCAL_IP": "127.0.0.1"}
    exe = Path(sys.executable).parent / "replicator"
    proc = subprocess.run(
        [str(exe), "demo", "--records", "20000", "--partitions", "3", "--value-size", "200",
         "--dir", str(tmp_path / "stack"), "--kafka", kafka],
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
    # The archive's Iceberg table, swapped by the Spark compaction, answers one query whose
    # counts add up to what was produced (the demo FAILs otherwise).
    assert re.search(r"the archive as an Iceberg table \(demo\.\w+, \d+ files", out), out
    # The demo started its own stack and stopped it: none of its servers is left.
    assert "starting the embedded stack" in out
    m = re.search(r"\(state in (\S+)\)", out)
    assert m is not None, out
    assert processes_writing_into(Path(m.group(1))) == set()
