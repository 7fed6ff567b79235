"""The fault campaign: seeded damage to every file kind, thousands of trials, a table.

The same trials as ``tests/fault/test_storage_damage.py`` (see
``tests/fault/damage_harness.py`` for what a trial does and how it is judged), run
by the thousand. Prints one row per file kind and damage with the count of each
outcome; any outcome other than ``detected``, ``harmless`` or ``not_applicable`` is
a failure of the rule for damage, listed after the table with its seed (rerun one
with ``--kind K --damage D --seed N --verbose``). Exits 1 if any trial failed.

    python bench/fault_campaign.py                  # 100 trials per kind and damage
    python bench/fault_campaign.py --trials 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fault"), str(ROOT / "bench")]

import damage_harness as H  # noqa: E402
from _harness import Progress, format_table  # noqa: E402

OUTCOMES = ("detected", "harmless", "not_applicable", *H.FAILURES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="trials per file kind and damage (default 100)")
    ap.add_argument("--kind", choices=H.KINDS, action="append", help="only this file kind (repeatable)")
    ap.add_argument("--damage", choices=H.DAMAGES, action="append", help="only this damage (repeatable)")
    ap.add_argument("--seed", type=int, help="run this one seed only")
    ap.add_argument("--verbose", action="store_true", help="print every trial's reports")
    args = ap.parse_args()
    kinds = args.kind or list(H.KINDS)
    damages = args.damage or list(H.DAMAGES)
    seeds = [args.seed] if args.seed is not None else list(range(args.trials))
    table: Counter[tuple[str, str, str]] = Counter()
    failed: list[H.Trial] = []
    total = len(kinds) * len(damages) * len(seeds)
    progress = Progress("trials", total)
    started = time.perf_counter()
    done = 0
    with tempfile.TemporaryDirectory(prefix="ttlbroker-faults-") as tmp:
        for kind in kinds:
            for how in damages:
                for seed in seeds:
                    trial = H.run_trial(Path(tmp), kind, how, seed)
                    table[(kind, how, trial.outcome)] += 1
                    if trial.outcome in H.FAILURES:
                        failed.append(trial)
                    if args.verbose:
                        print(f"{kind} {how} seed={seed}: {trial.outcome} {trial.problems}")
                        for d in trial.reported:
                            print("    " + d.line())
                    done += 1
                    progress.update(done)
    rows = []
    for kind in kinds:
        for how in damages:
            counts = [table[(kind, how, o)] for o in OUTCOMES]
            rows.append([kind, how, str(sum(counts)), *(str(c) for c in counts)])
    sums = [sum(table[(k, d, o)] for k in kinds for d in damages) for o in OUTCOMES]
    rows.append(["all", "", str(sum(sums)), *(str(c) for c in sums)])
    print(format_table(["file kind", "damage", "trials", *OUTCOMES], rows, right=range(2, 3 + len(OUTCOMES))))
    print(f"\n{total:,} trials in {time.perf_counter() - started:.1f} s; {len(failed)} failed the rule")
    for t in failed[:50]:
        print(f"  FAILED {t.kind} {t.damage} seed={t.seed}: {'; '.join(t.problems[:3])}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
