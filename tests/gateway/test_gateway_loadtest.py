"""`zmqflow loadtest --http URL`: the open-loop load test driving the gateway over HTTP, with its report."""

import json
import subprocess
import sys

import pytest

from zmqflow.common.errors import DeadlineExceededError, ResourceExhaustedError, UnknownError
from zmqflow.loadtest.http_target import error_of
from zmqflow.loadtest.open_loop import SHED


def loadtest(tmp_path, *args):
    report = tmp_path / "load.json"
    done = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", *args, "--json-out", str(report)],
                          capture_output=True, text=True, timeout=60)
    return done, (json.loads(report.read_text()) if report.exists() else None)


@pytest.mark.integration
def test_load_through_the_gateway_to_the_ensemble_and_to_one_member(topology, tmp_path):
    for model in ("ensemble", "m2"):
        done, report = loadtest(tmp_path, "--http", topology.gateway, "--model-name", model, "--rate", "100",
                                "--duration-secs", "1.5", "--deadline-ms", "2000", "--max-failures", "0", "--wait-secs", "10")
        assert done.returncode == 0, done.stdout + done.stderr
        overall = report["overall"]
        print(f"\nloadtest --http, model {model}, 100/s for 1.5 s: {overall}")
        assert overall["requests"] == 150 and overall["answered"] == 150 and overall["failed"] == 0
        assert overall["p50_ms"] is not None and "input [-1, 784] FP32" in report["requests_from"]
        assert "overall" in done.stdout and model in report["address"]


@pytest.mark.service
def test_unknown_models_and_exclusive_options_are_refused(topology, tmp_path):
    done, _ = loadtest(tmp_path, "--http", topology.gateway, "--model-name", "nobody", "--duration-secs", "1")
    assert done.returncode == 1 and "HTTP 404" in done.stderr and "nobody" in done.stderr
    done, _ = loadtest(tmp_path, "--http", topology.gateway, "--address", "tcp://127.0.0.1:1")
    assert done.returncode == 2 and "give one of --address ENDPOINT (the aggregator) or --http URL" in done.stderr
    done, _ = loadtest(tmp_path, "--http", topology.gateway, "--kill-member", "0")
    assert done.returncode == 2 and "go with --address only" in done.stderr


@pytest.mark.unit
def test_statuses_become_the_errors_the_report_counts():
    shed = error_of(429, b'{"error": "over capacity"}', "1")
    assert isinstance(shed, ResourceExhaustedError) and type(shed).__name__ == SHED and shed.retry_after == 1.0
    late = error_of(504, b'{"error": "deadline: m1 answered"}')
    assert isinstance(late, DeadlineExceededError) and str(late) == "HTTP 504: deadline: m1 answered"
    assert isinstance(error_of(418, b"teapot"), UnknownError)
