"""The stateful property tests of ingress delivery under failure, run long and randomized.

    python bench/ingress_stateful.py [--minutes 10] [--steps 60] [--machine both]

Runs ``tests/unit/ingress_machines.py``'s ``AtLeastOnceMachine`` and
``ExactlyOnceMachine`` (the CI runs them short and derandomized:
``tests/unit/test_ingress_stateful.py``) in rounds of fresh random examples until the time
is up, and prints the figures RELIABILITY.md keeps: examples and steps run, faults
injected, violations (an invariant that failed; each is printed with Hypothesis's shrunk
sequence of steps). No broker needed: the seams' fakes stand for Kafka. Exits 1 on a
violation.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from tests.unit import ingress_machines
from tests.unit.ingress_machines import AtLeastOnceMachine, ExactlyOnceMachine

ROUND_EXAMPLES = 50
"""Examples per round: a round is one Hypothesis run (its own random seed)."""


def run(machine: type[RuleBasedStateMachine], seconds: float, steps: int) -> dict[str, int]:
    """Rounds of ``machine`` for ``seconds``; its examples, steps, faults, violations."""
    out = {"examples": 0, "steps": 0, "faults": 0, "violations": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ingress_machines.STATS.clear()
        try:
            run_state_machine_as_test(machine, settings=settings(
                max_examples=ROUND_EXAMPLES, stateful_step_count=steps, deadline=None,
                database=None, suppress_health_check=list(HealthCheck)))
        except BaseException as e:     # an invariant, or any error: count it
            if isinstance(e, KeyboardInterrupt):
                raise
            out["violations"] += 1
            print(f"{machine.__name__}: VIOLATION {e!r}", flush=True)
        out["examples"] += ROUND_EXAMPLES
        out["steps"] += ingress_machines.STATS["steps"]
        out["faults"] += ingress_machines.STATS["faults"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="per machine")
    ap.add_argument("--steps", type=int, default=60, help="steps per example")
    ap.add_argument("--machine", choices=["both", "at-least-once", "exactly-once"],
                    default="both")
    args = ap.parse_args()
    # The machines release, purge and fence on purpose: their WARNINGs are the point.
    logging.basicConfig(level=logging.CRITICAL)
    machines: list[type[RuleBasedStateMachine]] = []
    if args.machine in ("both", "at-least-once"):
        machines.append(AtLeastOnceMachine)
    if args.machine in ("both", "exactly-once"):
        machines.append(ExactlyOnceMachine)
    failed = False
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    for m in machines:
        began = time.monotonic()
        r = run(m, args.minutes * 60, args.steps)
        failed |= r["violations"] > 0
        print(f"{m.__name__}: {r['examples']} examples, {r['steps']} steps, "
              f"{r['faults']} faults injected, {r['violations']} violations "
              f"({time.monotonic() - began:.0f} s, load average {os.getloadavg()[0]:.1f})",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
