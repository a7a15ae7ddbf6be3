"""`zmqflow bench scaling`'s arithmetic, without namespaces: tc rates, the global step rate between two times
from the workers' records, what limits a row, and the knee of a line (tests/netns/test_scaling.py runs the
bench itself, as root)."""

import pytest

from zmqflow.bench import scaling
from zmqflow.common.errors import InvalidArgumentError

pytestmark = pytest.mark.unit


def test_bandwidths_are_tc_rates_in_bits_per_second():
    assert scaling.bandwidth_bits("100mbit") == 1e8
    assert scaling.bandwidth_bits("1gbit") == 1e9
    assert scaling.bandwidth_bits("2.5Gbit") == 2.5e9
    for bad in ("fast", "1gb", "0mbit", "-1gbit", ""):
        with pytest.raises(InvalidArgumentError, match="tc's rates"):
            scaling.bandwidth_bits(bad)


def test_the_step_rate_is_interpolated_between_the_records_either_side_of_the_window():
    # two workers recording the global step at 50 steps/s together, the second one's records lagging
    records = sorted([(10 + i * 0.04, 2 * i) for i in range(100)] + [(10.02 + i * 0.04, 2 * i) for i in range(100)])
    assert scaling._steps_between(records, 11.0, 13.0) == pytest.approx(50, rel=0.02)
    assert scaling._steps_between(records, 9.0, 13.0) is None       # no record before the window
    assert scaling._steps_between(records, 11.0, 15.0) is None      # none after it
    assert scaling._steps_between([(1.0, 5), (3.0, 5)], 1.5, 2.5) == 0.0


def row(workers, examples, ps_util=0.1, worker_bytes=(0, 0), steps=100.0, busy=0.5):
    return {"model": "mlp", "bandwidth": "1gbit", "num_ps": 1, "num_workers": workers, "examples_per_s": examples,
            "steps_per_s": steps, "ps_link_utilisation": ps_util, "machine_busy": busy,
            "links": {"ps0": {}, "worker0": {"tx_bytes_per_step": worker_bytes[0],
                                             "rx_bytes_per_step": worker_bytes[1]}}}


def test_the_limit_is_a_busy_ps_link_then_a_worker_link_carrying_both_directions_then_the_cpu():
    bits = 1e8                                                       # 12.5 MB/s
    assert scaling.classify(row(1, 100, ps_util=0.85), bits)["limit"] == "ps link"
    # 50 KB out and 50 KB in per step at 100 steps/s: 80 Mbit/s one after the other, 40 either way
    serial = scaling.classify(row(1, 100, worker_bytes=(50_000, 50_000)), bits)
    assert serial["limit"] == "worker link" and serial["worker_link_serial"] == pytest.approx(0.8)
    assert scaling.classify(row(1, 100, worker_bytes=(30_000, 30_000), busy=0.95), bits)["limit"] == "cpu"
    assert scaling.classify(row(1, 100, worker_bytes=(30_000, 30_000)), bits)["limit"] == "-"


def test_the_knee_is_where_doubling_the_workers_adds_under_15_percent():
    line = [dict(row(1, 1000), limit="-"), dict(row(2, 1900), limit="-"), dict(row(4, 2100), limit="ps link"),
            dict(row(8, 2150), limit="ps link")]
    (knee,) = scaling.knees(line)
    assert (knee["knee_workers"], knee["knee_limit"], knee["best_workers"]) == (2, "-", 8)
    rising = [dict(row(w, 1000 * w), limit="cpu") for w in (1, 2, 4)]
    assert scaling.knees(rising)[0]["knee_workers"] is None
    two_ps = [dict(row(w, 1500 * w), num_ps=2, limit="cpu") for w in (1, 2, 4)]
    assert scaling.shards_pay(rising + two_ps) == [{"model": "mlp", "bandwidth": "1gbit", "num_ps": 2,
                                                    "vs_1_ps": 1.5}]
