"""`zmqflow bench train`'s pull figures (bench/train.py `ps_rates`): pulls from a real ps shard process taken in
turn with raw echoes of the same bytes from a process of their own (the baseline) and from a thread of the bench
(the former baseline); the ratios are the rounds' medians (timings belong to the benchmark, not here)."""

from statistics import median

import pytest

from zmqflow.bench.train import ps_rates

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pulls_are_reported_against_both_raw_echoes():
    result = ps_rates(seconds=0.2, rounds=3)
    for key in ("ps_pulls_per_s_mlp", "ps_pushes_per_s_mlp", "raw_roundtrips_per_s_318kb",
                "raw_inprocess_roundtrips_per_s_318kb"):
        assert result[key] > 0, key
    for key in ("pull_vs_raw", "pull_vs_raw_inprocess"):
        rounds = result[f"{key}_rounds"]
        assert len(rounds) == 3 and all(r > 0 for r in rounds)
        assert result[key] == median(rounds)
