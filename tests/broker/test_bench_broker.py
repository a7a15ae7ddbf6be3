"""`zmqflow bench broker --json`: it runs in a tiny configuration and reports each figure with its baseline
from the same run and their ratios (their presence and arithmetic, not thresholds: timings belong to the
benchmark), redis-benchmark's figure or the reason it was skipped."""

import json
import subprocess
import sys

import pytest

from zmqflow.bench.broker import Redis

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_broker_reports_ratios_against_its_baselines():
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "broker", "--json", "--duration-secs", "0.05",
                           "--rounds", "1", "--clients", "4", "--no-memory"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rounds"] == 1 and result["clients"] == 4
    for key in ("small_enqueue_per_s", "small_dequeue_per_s", "small_ops_per_s",
                "batch_mb_per_s", "raw_relay_mb_per_s", "p50_us", "p99_us"):
        assert result[key] > 0, key
    assert result["p50_us"] <= result["p99_us"]
    # CPU seconds of the broker process from /proc (clock ticks: a tiny run may read 0)
    assert result["broker_cpu_us_per_request"] >= 0 and result["broker_cpu_us_per_batch"] >= 0
    assert result["batch_vs_raw"] == pytest.approx(result["batch_mb_per_s"] / result["raw_relay_mb_per_s"], rel=0.01)
    if Redis().skipped is None:
        assert "redis_skipped" not in result
        for key in ("redis_lpush_per_s", "redis_rpop_per_s", "redis_ops_per_s"):
            assert result[key] > 0, key
        assert result["redis_cpu_us_per_request"] >= 0
        assert result["small_vs_redis"] == pytest.approx(result["small_ops_per_s"] / result["redis_ops_per_s"],
                                                         rel=0.01)
    else:
        assert "not installed" in result["redis_skipped"] and "small_vs_redis" not in result
    assert "memory_FIFOQueue" not in result  # --no-memory


def test_redis_baseline_is_skipped_with_its_reason_when_redis_is_not_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server, no redis-benchmark
    redis = Redis()
    assert redis.skipped.startswith("redis-server or redis-benchmark is not installed")
