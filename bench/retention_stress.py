"""Retention under a lagging egress, many times over, on Apache Kafka: does a partition ever
stall?

    KAFKA_HOME=../shared/kafka .venv/bin/python bench/retention_stress.py [--runs 20]
                                                                        [--tests EXPR]

Each run is one pytest session of ``tests/integration/test_kafka_retention.py`` (new
brokers, moto server, topics): records deleted by retention before egress read them, records
deleted while egress was frozen (SIGSTOP) with a segment open and thawed (SIGCONT), a log
start that cannot be read (stalled, then recovered), and records skipped by origin then
deleted. A stall shows as a failed run (each test waits at most 60 s for the records after
the deleted ones). ``--tests`` selects tests by a pytest ``-k`` expression, e.g.
``--tests open`` for the SIGSTOP case alone.

Printed per run: pass/fail, seconds, the load average at its end; at the end the count of
failed runs and the log of each. CI runs each case once (the test suite); this loops them.
There is no timing ratio here: the measure is the number of stalls, which must be 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/integration/test_kafka_retention.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tests", default="", help="a pytest -k expression")
    args = ap.parse_args()
    if not os.environ.get("KAFKA_HOME"):
        print("KAFKA_HOME must name an Apache Kafka distribution (e.g. ../shared/kafka)",
              file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="retention-stress-"))
    failed: list[Path] = []
    for i in range(1, args.runs + 1):
        log = logs / f"run{i}.log"
        cmd = [sys.executable, "-m", "pytest", "-q", TESTS, "-p", "no:cacheprovider",
               "--basetemp", str(logs / f"tmp{i}")]
        if args.tests:
            cmd += ["-k", args.tests]
        start = time.monotonic()
        with open(log, "wb") as out:
            code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, check=False).returncode
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) \
            if Path("/proc/loadavg").exists() else "?"
        print(f"run {i:3d}: {'pass' if code == 0 else 'FAIL'} "
              f"{time.monotonic() - start:6.1f} s  load {load}", flush=True)
        if code != 0:
            failed.append(log)
    print(f"{args.runs - len(failed)} passed, {len(failed)} failed")
    for log in failed:
        print(f"  {log}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
