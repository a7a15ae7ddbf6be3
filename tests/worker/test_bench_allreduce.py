"""`zmqflow bench allreduce`: the ring over real processes against gloo's all-reduce of the same bytes, and the
gloo rows skipped, saying why, without torch (the figures fit together; timings belong to the benchmark)."""

import sys

import pytest

from zmqflow.bench import allreduce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.torch
def test_bench_allreduce_reports_the_ring_beside_gloo():
    pytest.importorskip("torch.distributed")
    result = allreduce.run(ranks=2, rounds=3, warm_up=1, sizes={"4kb": 1000})
    ring_ms, gloo_ms = result["allreduce_2r_4kb_zmq_ms"], result["allreduce_2r_4kb_gloo_ms"]
    assert ring_ms > 0 and gloo_ms > 0
    assert result["allreduce_2r_4kb_zmq_vs_gloo"] == pytest.approx(gloo_ms / ring_ms, rel=0.01)
    assert result["allreduce_2r_4kb_zmq_mb_per_s"] == pytest.approx(4000 / ring_ms / 1000, abs=0.06)


def test_without_torch_the_gloo_rows_say_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed", None)     # import torch.distributed fails
    result = allreduce.run(ranks=2, rounds=2, warm_up=1, sizes={"4kb": 1000})
    assert result["allreduce_2r_4kb_zmq_ms"] > 0 and "allreduce_2r_4kb_gloo_ms" not in result
    assert "pip install 'zmqflow[torch]'" in result["allreduce_gloo_skipped"]
