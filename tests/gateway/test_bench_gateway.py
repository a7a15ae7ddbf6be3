"""`zmqflow bench serve`'s gateway phase (bench/gateway.py): ZeroMQ, REST JSON, REST binary and gRPC in the same
run against the same aggregator, each with p50, p99, req/s and the p50 overhead over ZeroMQ; and its HTTP load phase
(wrk, else its own closed loop) on the gateway in front of one model server, with MLServer when installed."""

import shutil

import numpy as np
import pytest

from zmqflow.bench.gateway import MLSERVER_COMMAND, MLSERVER_ENV, _http_load, _json_body, _load_generator, compare, \
    http_load, parse_wrk
from zmqflow.bench.serve import mlp_layers

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


WRK_REPORT = """Running 3s test @ http://127.0.0.1:8000/v2/models/m1/infer
  2 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.10ms    2.01ms  31.20ms   88.00%
  Latency Distribution
     50%  812.00us
     75%    4.40ms
     90%    5.90ms
     99%    1.20s
  5000 requests in 3.00s, 1.00MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 4
Requests/sec:   1666.50
Transfer/sec:    341.00KB
"""


def test_a_wrk_report_is_read_in_milliseconds_with_its_errors():
    assert parse_wrk(WRK_REPORT) == {"qps": 1666.5, "p50_ms": 0.812, "p99_ms": 1200.0, "errors": 7}


def test_the_http_load_phase_measures_the_gateway_and_names_the_mlserver_comparison(topology, tmp_path, monkeypatch):
    monkeypatch.delenv(MLSERVER_ENV, raising=False)
    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    result = http_load(topology.members["m1"].endpoint, "m1", mlp_layers(1), x, 1.0, str(tmp_path), rounds=1)
    print(f"\n{result}")
    assert result["http_zmqflow_errors"] == 0 and result["http_zmqflow_qps"] > 0
    assert 0 < result["http_zmqflow_p50_ms"] <= result["http_zmqflow_p99_ms"]
    if shutil.which("mlserver") is None:
        assert "not installed" in result["mlserver_skipped"] and result["mlserver_command"] == MLSERVER_COMMAND
        assert "http_qps_vs_mlserver" not in result
    else:
        assert result["http_mlserver_errors"] == 0 and result["http_qps_vs_mlserver"] > 0


def test_without_wrk_the_load_is_the_benchs_own_closed_loop(topology, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "wrk" else which(name))
    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    body, headers = _json_body(x)
    run = _http_load(f"{topology.single}/v2/models/m1/infer", body, headers, 0.5)
    assert run["qps"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"] and run["errors"] == 0
    assert "closed loop" in _load_generator()
