"""The stateful property tests of ingress delivery under failure, short and derandomized
(CI); the long, randomized run is ``bench/ingress_stateful.py`` (RELIABILITY.md, "Loss
and stall paths in ingress"). The example counts are what it took, with this seed, to
find each fixed bug again when its fix is removed (checked: the shared producer's
per-partition failures and counts, per-grant epochs, checkpoints not delivered before
the generation check)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from tests.unit.ingress_machines import AtLeastOnceMachine, ExactlyOnceMachine


def short(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=30, deadline=None,
                    derandomize=True, suppress_health_check=[HealthCheck.too_slow])


TestAtLeastOnce = AtLeastOnceMachine.TestCase
TestAtLeastOnce.settings = short(40)

TestExactlyOnce = ExactlyOnceMachine.TestCase
TestExactlyOnce.settings = short(200)
