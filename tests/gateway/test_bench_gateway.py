"""`zmqflow bench serve`'s gateway phase (bench/gateway.py): ZeroMQ, REST JSON, REST binary and gRPC in the same
run against the same aggregator, each with p50, p99, req/s and the p50 overhead over ZeroMQ."""

import numpy as np
import pytest

from zmqflow.bench.gateway import compare

pytestmark = pytest.mark.service


def test_the_gateway_phase_measures_rest_and_grpc_in_one_run(topology, tmp_path):
    pytest.importorskip("grpc", reason="the grpc extra installs grpcio (pip install 'zmqflow[grpc]')")
    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    result = compare(topology.aggregator.endpoint, x, seconds=0.6, concurrency=2, log_dir=str(tmp_path))
    print(f"\n{result}")
    for path in ("zmq", "gateway", "gateway_binary", "gateway_grpc"):
        assert 0 < result[f"{path}_p50_ms"] <= result[f"{path}_p99_ms"] and result[f"{path}_qps"] > 0
    for path in ("gateway", "gateway_binary", "gateway_grpc"):
        assert result[f"{path}_overhead_p50_ms"] == round(result[f"{path}_p50_ms"] - result["zmq_p50_ms"], 3)
