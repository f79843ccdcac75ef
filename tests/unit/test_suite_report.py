"""The suite's closing report: JUnit files from several pytest runs summed per tier."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.suite_report import main, render, tally, tier_of

LIGHT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.unit.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.app.test_b.TestX" name="test_fails" time="900.0"><failure message="no"/></testcase>
<testcase classname="tests.app.test_b" name="test_skipped" time="0.0"><skipped message="long"/></testcase>
<testcase classname="tests.static.test_c" name="test_errors" time="2.0"><error message="fixture"/></testcase>
</testsuite></testsuites>"""
ENGINE = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="1">
<testcase classname="tests.engine.test_d" name="test_ok" time="10.25"/>
</testsuite></testsuites>"""


def test_tier_is_the_directory_under_tests():
    assert tier_of("tests.app.test_proxy") == "app"
    assert tier_of("tests.engine.test_up.TestUp") == "engine"
    assert tier_of("conftest") == "other"


def test_runs_are_summed_per_tier_and_counted_in_one_closing_line(tmp_path: Path):
    (tmp_path / "light.xml").write_text(LIGHT)
    (tmp_path / "engine.xml").write_text(ENGINE)
    tiers = tally(tmp_path)
    assert (tiers["app"].tests, tiers["app"].failed, tiers["app"].skipped) == (2, 1, 1)
    assert tiers["app"].seconds == 900.0 and tiers["static"].failed == 1
    lines = render(tiers)
    assert lines[-1] == "suite: 2 passed, 2 failed, 1 skipped"
    assert [line.split()[0] for line in lines[1:-2]] == ["unit", "static", "app", "engine"]
    assert any(line.startswith("app") and "OVER BUDGET" in line for line in lines)
    assert not any(line.startswith("engine") and "OVER BUDGET" in line for line in lines)


def test_no_report_at_all_is_a_failure(tmp_path: Path):
    assert main([str(tmp_path)]) == 1


def test_the_vllm018_run_is_a_tier_of_its_own_although_its_tests_live_in_tests_engine(tmp_path: Path):
    (tmp_path / "engine.xml").write_text(ENGINE)
    (tmp_path / "vllm018.xml").write_text(ENGINE.replace('time="10.25"', 'time="4.0"'))
    tiers = tally(tmp_path)
    assert (tiers["engine"].tests, tiers["engine"].seconds) == (1, 10.25)
    assert (tiers["vllm018"].tests, tiers["vllm018"].seconds) == (1, 4.0)
    assert render(tiers)[-1] == "suite: 2 passed, 0 failed, 0 skipped"
