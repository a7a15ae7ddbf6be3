"""`zmqflow bench serve --overload`: capacity by a ramp, 2x of it, then half, with and without shedding; the report's
figures fit together (their sizes, not the targets: timings belong to the benchmark, not to tests)."""

import pytest

from zmqflow.bench.serve import run_overload

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_overload_reports_capacity_goodput_shedding_and_recovery():
    result = run_overload(seconds=1.0, recover_s=1.0, step_s=0.5, hidden=256, deadline_ms=100)
    capacity = result["capacity_per_s"]
    ramp = result["capacity_ramp"]
    assert capacity > 0 and capacity == max(step["goodput"] for step in ramp) and len(ramp) >= 2
    for name in ("shedding", "baseline_no_shedding"):
        phase = result[name]
        assert phase["offered_per_s"] == pytest.approx(2 * capacity, rel=0.05)
        assert phase["after"]["offered_per_s"] == pytest.approx(0.5 * capacity, rel=0.05)
        assert phase["goodput_ratio"] == pytest.approx(phase["goodput_per_s"] / capacity, abs=0.002)
        assert 0 <= phase["recovery_s"] <= 1.0
    assert result["baseline_no_shedding"]["shed_share"] == 0    # --admit-share 0: never sheds
    assert "UnavailableError" not in result["shedding"]["failures"]  # the floor: never 'no healthy member'
    assert set(result["targets"]) == {"goodput_at_2x>=0.9_capacity", "no_failures_at_2x"}


@pytest.mark.unit
def test_recovery_is_when_every_later_quarter_second_had_full_goodput():
    from zmqflow.bench.serve import recovery_s
    from zmqflow.loadtest.open_loop import Outcome, Run
    run = Run(100.0, 3.0)
    for i in range(200):       # 1.0 to 3.0 s: late until 1.6 s, then answered in time but for one straggler
        due = 1.0 + i / 100
        run.outcomes.append(Outcome(due, latency_ms=150.0 if due < 1.6 or i == 150 else 5.0))
    assert recovery_s(run, 1.0, 3.0, deadline_ms=100) == 0.75   # the straggler is 1 of 25 in its window
    assert recovery_s(run, 2.0, 3.0, deadline_ms=100) == 0.0
