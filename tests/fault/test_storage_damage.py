"""Seeded damage to every file kind of a partition: bit flips, truncations and
zeroed 4 KiB pages, each trial judged by the rule for damage (``damage_harness``).
``bench/fault_campaign.py`` runs the same trials by the thousand and prints a table."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import damage_harness as H  # noqa: E402

SEEDS = range(20)


@pytest.mark.parametrize("how", H.DAMAGES)
@pytest.mark.parametrize("kind", H.KINDS)
def test_damage_is_detected_and_handled_by_the_rule(tmp_path: Path, kind: str, how: str) -> None:
    outcomes: dict[str, int] = {}
    failures = []
    for seed in SEEDS:
        trial = H.run_trial(tmp_path, kind, how, seed)
        outcomes[trial.outcome] = outcomes.get(trial.outcome, 0) + 1
        if trial.outcome in H.FAILURES:
            failures.append((seed, trial.problems[:3], [d.line() for d in trial.reported]))
    assert not failures, failures
    # The trials must mostly hit something that matters, or they prove little.
    assert outcomes.get("detected", 0) >= len(SEEDS) // 3, outcomes
