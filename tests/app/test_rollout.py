"""A rolling update behind a real load balancer fails no request and cuts no stream.

Two replicas (real sidecars in front of the FAKE engine streaming a token every 0.3 s) behind a
real HAProxy that follows `/ready` with a few seconds of propagation and never retries, a steady
streaming load, and every replica replaced one at a time as a Deployment with maxSurge 1 /
maxUnavailable 0 does (tests/helpers/rollout.py). With PALMYRA_DRAIN_PROPAGATION_S longer than the
balancer needs to notice, the clients see nothing; with 0, the same rollout fails requests: the
control shows the failures the delay prevents. Timing-sensitive: run it alone on a busy machine.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.rollout import HEADER, Report, simulate

# HAProxy checks /ready every second and drops a replica after 3 failures: 2-3 s of propagation.
INTER_S, FALL = 1.0, 3
PROPAGATION_S = 5.0  # the sidecar keeps serving this long after SIGTERM: above the 3 s worst case


def _show(report: Report) -> str:
    text = f"{HEADER}\n{report.row()}\n" + "\n".join(report.failures())
    print(text)
    return text


def test_rollout_with_propagation_delay_fails_no_request_and_cuts_no_stream(tmp_path: Path) -> None:
    report = simulate(tmp_path, PROPAGATION_S, inter_s=INTER_S, fall=FALL)
    shown = _show(report)
    assert len(report.replacements) == 2 and report.tally.sent >= 30, shown
    for rep in report.replacements:
        assert rep.exit_code == 0, shown
        # The premise: the balancer stopped routing before the sidecar started refusing.
        assert rep.lb_down_after_s is not None and rep.lb_down_after_s < PROPAGATION_S, shown
        assert rep.exit_after_s >= PROPAGATION_S, shown
    assert report.tally.count("failed") == 0, shown
    assert report.tally.count("cut") == 0, shown
    # The window was used: the old replicas took new requests after their SIGTERM, and served them.
    assert report.served_after_sigterm() > 0, shown


def test_rollout_without_propagation_delay_fails_requests(tmp_path: Path) -> None:
    report = simulate(tmp_path, 0.0, inter_s=INTER_S, fall=FALL)
    shown = _show(report)
    assert len(report.replacements) == 2, shown
    assert all(rep.exit_code == 0 for rep in report.replacements), shown
    # Routed to a replica that already refuses (503 draining) or is gone (HAProxy's own 503).
    assert report.tally.count("failed") > 0, shown
    assert report.tally.count("cut") == 0, shown  # in-flight streams still drain
