"""zmqflow cluster check against live and dead addresses, and specs that are wrong."""

import json
import os
import subprocess
import sys

import pytest

from tests.deploy.conftest import ROOT
from tests.support import free_port

pytestmark = pytest.mark.service

ZMQFLOW = os.path.join(os.path.dirname(sys.executable), "zmqflow")


def check(*args, env=None):
    done = subprocess.run([ZMQFLOW, "cluster", "check", "--timeout-secs", "1", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def live(module_processes):
    return module_processes.service("zmqflow.services.broker").endpoint


def test_all_up(live, tmp_path):
    code, out, _ = check("--broker", live, "--worker", "127.0.0.1:1", "--json")
    assert code == 0, out
    result = json.loads(out)
    assert result["valid"] and result["healthy"]
    broker, worker = sorted(result["tasks"], key=lambda r: r["job"])
    assert broker["status"] == "up" and broker["service"] == "queue-broker" and broker["latency_ms"] > 0
    assert worker["status"] == "client"                # workers dial out: listed, not pinged


def test_one_down_from_a_file_is_named(live, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    spec = tmp_path / "cluster.yaml"
    spec.write_text(f"broker: ['{live.split('://')[1]}']\nps: ['{dead}']\n")
    code, out, _ = check("--cluster", str(spec))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split() == ["job", "task", "address", "status", "latency_ms", "service"]
    assert any(line.split()[:4] == ["ps", "0", dead, "down"] for line in lines)
    assert any(line.split()[:4] == ["broker", "0", live.split("://")[1], "up"] for line in lines)
    assert f"ps:0 {dead}: UnavailableError" in out


def test_tf_config_is_the_default_source(live):
    tf_config = json.dumps({"cluster": {"broker": [live.split("://")[1]], "worker": ["127.0.0.1:2"]},
                            "task": {"type": "worker", "index": 0}})
    code, out, _ = check("--json", env={"TF_CONFIG": tf_config})
    assert code == 0 and json.loads(out)["healthy"]


@pytest.mark.parametrize("args, message", [
    (["--ps", "127.0.0.1:5600,127.0.0.1:5600"], "used by both job 'ps' task 0 and job 'ps' task 1"),
    (["--ps", "127.0.0.1:99999"], "out of range"),
    (["--job", "bad-name=127.0.0.1:5600"], "job name 'bad-name' is not valid"),
    (["--ps", "localhost"], "has no port"),
])
def test_invalid_specs_exit_2(args, message):
    code, out, err = check(*args)
    assert code == 2 and message in err, (out, err)
    code, out, _ = check(*args, "--json")
    assert code == 2 and message in json.loads(out)["error"]


def test_no_cluster_at_all_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([ZMQFLOW, "cluster", "check"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2 and "no cluster" in done.stderr
