"""The suite's closing report: each tier's pytest time against its budget, read from the JUnit
files ./test.sh has pytest write for each of its runs, and one closing line that counts the tests
of every run.

    python -m tests.helpers.suite_report REPORT_DIR

A tier's time is the sum of its tests' times (set-up, call and tear-down, as pytest's JUnit file
records them): the work the tier costs, whether its tests ran one after the other or on parallel
workers. The budgets are BUDGET_S below (CONTRIBUTING.md says how a change keeps to them); a tier
over its budget is named, never failed here: timings are noisy, so a budget is kept by review, not
by a timed test.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# Seconds of pytest time per tier on the 2-core machine CI runs on: what ./test.sh measured from a
# fresh clone on an AVX2-only 2-core EPYC (unit 80-92, static 239-318, app 586-713 on 3 workers beside
# the image build; engine 751-863, 923 in a run whose venv had no bytecode, container 339-489,
# vllm018 245; three runs), plus room for noise and new tests.
BUDGET_S = {"unit": 120, "static": 360, "app": 780, "engine": 900, "container": 600, "vllm018": 300}
# Runs that are a tier of their own although their tests live in another tier's directory: the
# vllm018 run is tests/engine's engine_contract tests again, against vLLM 0.18.0.
RUN_TIERS = {"vllm018"}


@dataclass
class Tally:
    tests: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return self.tests - self.failed - self.skipped


def tier_of(classname: str) -> str:
    """tests.app.test_proxy (or tests.app.test_proxy.TestX) -> app."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def tally(report_dir: Path) -> dict[str, Tally]:
    tiers: dict[str, Tally] = {}
    for path in sorted(report_dir.glob("*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            tier = path.stem if path.stem in RUN_TIERS else tier_of(case.get("classname", ""))
            t = tiers.setdefault(tier, Tally())
            t.tests += 1
            t.seconds += float(case.get("time") or 0.0)
            if case.find("failure") is not None or case.find("error") is not None:
                t.failed += 1
            elif case.find("skipped") is not None:
                t.skipped += 1
    return tiers


def render(tiers: dict[str, Tally]) -> list[str]:
    lines = [f"{'tier':<10} {'tests':>6} {'time s':>8} {'budget s':>9}"]
    total = Tally()
    for name in [*BUDGET_S, *sorted(set(tiers) - set(BUDGET_S))]:
        t = tiers.get(name)
        if t is None:
            continue
        budget = BUDGET_S.get(name)
        over = "  OVER BUDGET" if budget is not None and t.seconds > budget else ""
        lines.append(f"{name:<10} {t.tests:>6} {t.seconds:>8.0f} {budget if budget is not None else '-':>9}{over}")
        total.tests += t.tests
        total.failed += t.failed
        total.skipped += t.skipped
        total.seconds += t.seconds
    lines.append(f"{'all':<10} {total.tests:>6} {total.seconds:>8.0f}")
    # The plain closing line: every run's tests counted together.
    lines.append(f"suite: {total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.helpers.suite_report REPORT_DIR", file=sys.stderr)
        return 2
    tiers = tally(Path(argv[0]))
    print("\n".join(render(tiers)))
    return 0 if tiers else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
