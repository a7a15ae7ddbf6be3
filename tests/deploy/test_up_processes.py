"""zmqflow up for real: the shipped compose file trains to completion; order, exits and stops."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from zmqflow.common.errors import OpError
from tests.deploy.conftest import COMPOSE, ROOT, compose_ports
from tests.support import free_port_offset, wait_for
from tests.support.processes import alive

pytestmark = pytest.mark.integration

ZMQFLOW = os.path.join(os.path.dirname(sys.executable), "zmqflow")
TRAINING = ["data", "broker", "ps0", "ps1", "reader", "worker0", "worker1"]


def up(args, env=None, timeout=90):
    """Run `zmqflow up ARGS` to its end; on a timeout, SIGTERM (it stops its services), then SIGKILL."""
    proc = subprocess.Popen([ZMQFLOW, "up", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
        pytest.fail(f"zmqflow up did not finish in {timeout} s:\n{out[-5000:]}")
    return proc.returncode, out


def gone(pid):
    """True once no process has `pid` (within 5 s, else AssertionError): nothing outlives zmqflow up."""
    return wait_for(lambda: not alive(pid), 5.0, f"pid {pid} to exit")




def test_shipped_compose_file_trains_to_completion(project, tmp_path):
    offset = free_port_offset(compose_ports(project))
    code, out = up(["-f", COMPOSE, "--port-offset", str(offset), "--workdir", str(tmp_path), "--abort-on-failure",
                    "--services", ",".join(TRAINING)], env={"EPOCHS": "1"})
    assert code == 0, out[-5000:]
    for name in TRAINING:   # every service ends by itself, with 0: the job is complete
        assert f"zmqflow up: {name} exited with code 0" in out, out[-5000:]
    assert "worker0 is done" in out and "stopping every service" in out
    assert re.search(r"^worker0  \| .*test metrics: accuracy 0\.\d+", out, re.M)
    assert f"listening on tcp://127.0.0.1:{5555 + offset}" in out and f"127.0.0.1:{5601 + offset}" in out
    assert os.listdir(tmp_path / "zmqflow-data" / "ckpt"), "the chief's checkpoints are in the local volume"
    assert "prepared mnist (multiclass; rows: train 4,500, test 500): 4,500 train rows" in out   # the data service
    assert len([f for f in os.listdir(tmp_path / "zmqflow-data" / "prepared") if f.endswith(".bin")]) == 8
    assert out.index("data exited with code 0") < re.search(r"^reader +\| ", out, re.M).start()   # reader after it
    pids = [int(p) for p in re.findall(r"listening on \S+ \(pid (\d+)\)", out)]
    assert len(pids) == 3 and all(gone(pid) for pid in pids)


def test_shipped_compose_file_trains_on_your_own_data_and_model(project, tmp_path):
    """ZMQFLOW_DATA and ZMQFLOW_MODEL: a CSV and its spec in the user directory (mounted at /user), the
    same services; the chief scores the spec's test split."""
    import yaml
    from tests.support.tabular import spec_dict, write_csv
    user = tmp_path / "user"
    user.mkdir()
    write_csv(user / "pets.csv", 1500, seed=2)
    spec = spec_dict("pets.csv", split={"test": 0.2, "seed": 0})          # relative to the spec file
    (user / "pets.yaml").write_text(yaml.safe_dump(spec))
    offset = free_port_offset(compose_ports(project))
    code, out = up(["-f", COMPOSE, "--port-offset", str(offset), "--workdir", str(tmp_path), "--abort-on-failure",
                    "--services", ",".join(TRAINING)],
                   env={"EPOCHS": "8", "ZMQFLOW_USER_DIR": str(user), "ZMQFLOW_DATA": "/user/pets.yaml",
                        "ZMQFLOW_MODEL": "logistic"})
    assert code == 0, out[-5000:]
    assert "prepared data (multiclass; rows: train 1,200, test 300): 1,200 train rows of 28 bytes" in out, out[-3000:]
    accuracy = float(re.search(r"^worker0  \| .*test metrics: accuracy (0\.\d+)", out, re.M).group(1))
    assert accuracy > 0.8, out[-3000:]


@pytest.mark.timeout(300)
def test_shipped_topology_serves_an_ensemble_through_the_aggregator(project, tmp_path):
    """The whole file: training, then the model servers on the chief's final checkpoint behind the
    aggregator; the chief's exit does not end the run, since the servers wait for its completion."""
    from zmqflow.common.clients.aggregator import AggregatorClient
    from zmqflow.common.rpc.client import RpcClient
    offset = free_port_offset(compose_ports(project))
    aggregator = f"tcp://127.0.0.1:{5800 + offset}"
    keys = str(tmp_path / "zmqflow-keys")   # CURVE: the keys service's volume, a local directory here
    proc = subprocess.Popen([ZMQFLOW, "up", "-f", COMPOSE, "--port-offset", str(offset), "--workdir", str(tmp_path)],
                            cwd=ROOT, env={**os.environ, "EPOCHS": "2", "CHECKPOINT_EVERY_STEPS": "20"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def three_healthy_members():
            assert proc.poll() is None, "zmqflow up exited"
            with RpcClient(aggregator, default_timeout=1.0, curve_dir=keys) as client:
                return client.call("info")[0]["healthy"] == 3
        wait_for(three_healthy_members, 180, "the aggregator to have 3 healthy members", interval=0.5,
                 retry_on=OpError)
        x = np.random.default_rng(0).random((4, 784), dtype=np.float32)
        with AggregatorClient(aggregator, curve_dir=keys) as client:
            probabilities, info = client.predict(x, deadline_ms=2000)
        assert probabilities.shape == (4, 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
        assert info["answered"], info
        roles_of_the_deployments_keys(aggregator, keys, x)
        # the shipped topology's Prometheus endpoints, moved by the offset with everything else
        scraped = {name: urllib.request.urlopen(f"http://127.0.0.1:{port + offset}/metrics", timeout=5).read().decode()
                   for name, port in (("aggregator", 6800), ("serve0", 6700))}
        assert re.search(r'^zmqflow_aggregator_requests_total(\{[^}]*\})? [1-9]', scraped["aggregator"], re.M), \
            scraped["aggregator"][:3000]
        assert "zmqflow_rpc_request_duration_seconds_bucket" in scraped["serve0"]
        predictions_through_the_gateway(f"127.0.0.1:{8000 + offset}", x)
        predictions_over_grpc(f"127.0.0.1:{8001 + offset}", x)
        gateway_metrics = urllib.request.urlopen(f"http://127.0.0.1:{9000 + offset}/metrics", timeout=5).read().decode()
        for sample in ('zmqflow_gateway_infer_requests_total{model="ensemble",status="200",task="gateway"} 2.0',
                       'zmqflow_gateway_grpc_infer_requests_total{code="OK",model="ensemble",task="gateway"} 1.0'):
            assert sample in gateway_metrics, gateway_metrics[:3000]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        finally:
            proc.kill()
    for name in ("serve0", "serve1", "serve2", "aggregator", "gateway"):
        assert f"zmqflow up: {name} exited with code 0" in out, out[-5000:]
    assert out.index("zmqflow up: worker0 exited with code 0") < re.search(r"^serve0 +\| ", out, re.M).start()


def roles_of_the_deployments_keys(aggregator, keys, x):
    """The keys `zmqflow up`'s keys service made, as its components use them: the gateway's `serving` key is
    served predictions and refused the admin op that would slip a model into the ensemble; `member` too."""
    from zmqflow.common.clients.aggregator import AggregatorClient
    from zmqflow.common.errors import PermissionDeniedError
    from zmqflow.common.rpc import encryption as curve
    for key in ("serving", "member"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv(curve.KEY_ENV, key)
            with AggregatorClient(aggregator, curve_dir=keys) as client:
                assert client.predict(x, deadline_ms=2000)[0].shape == (4, 10)
                with pytest.raises(PermissionDeniedError) as caught:
                    client.add_member("tcp://127.0.0.1:1")
                assert str(caught.value) == (f"add_member on the aggregator at {aggregator} is an admin op: the CURVE "
                                             f"client key '{key}' is not granted the admin role")
                assert len(client.members()) == 3


def predictions_through_the_gateway(address, x):
    """The gateway `zmqflow up` started: plain HTTP (what curl sends) and tritonclient.http get predictions from
    the ensemble and from single members (the model servers share the name `model`: model, model-2, model-3)."""
    import json
    import tritonclient.http as httpclient

    def ready(path):
        try:
            return urllib.request.urlopen(f"http://{address}{path}", timeout=2).status == 200
        except OSError:
            return False
    wait_for(lambda: ready("/v2/health/ready") and ready("/v2/models/model-3/ready"), 30,
             "the gateway to serve the ensemble and its 3 members", interval=0.3)
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    for model in ("ensemble", "model"):
        request = urllib.request.Request(f"http://{address}/v2/models/{model}/infer", body,
                                         {"Content-Type": "application/json", "X-Zmqflow-Deadline-Ms": "2000"})
        answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
        [output] = answer["outputs"]
        assert answer["model_name"] == model and output["shape"] == [4, 10], answer
        assert np.allclose(np.reshape(output["data"], (4, 10)).sum(axis=1), 1.0, atol=1e-4)
    client = httpclient.InferenceServerClient(address, network_timeout=10.0)
    try:
        for model in ("ensemble", "model-2"):
            result = infer_probabilities(httpclient, client, model, x, timeout=2_000_000)   # microseconds
        assert result.get_response()["model_name"] == "model-2"
    finally:
        client.close()


def predictions_over_grpc(address, x):
    """The same gateway's gRPC port (--grpc-bind, moved by the offset like every port): tritonclient.grpc gets the
    ensemble's and a member's predictions, as over HTTP."""
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(address) as client:
        assert client.is_server_ready() and client.is_model_ready("model-3")
        for model in ("ensemble", "model-3"):
            result = infer_probabilities(grpcclient, client, model, x, client_timeout=10)   # seconds
            assert result.get_response().model_name == model


def infer_probabilities(tritonclient, client, model, x, **deadline):
    """`client.infer` of the rows `x` to `model` with tritonclient's http or grpc module (the same calls; the
    deadline's keyword differs), its probabilities checked: [rows, 10], each row summing to 1."""
    data = tritonclient.InferInput("input", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    result = client.infer(model, [data], **deadline)
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (len(x), 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4), model
    return result


def write(tmp_path, text):
    path = tmp_path / "compose.yml"
    path.write_text(text)
    return str(path)


def test_healthy_dependency_first_and_exit_code_from(tmp_path):
    compose = write(tmp_path, """
x-base: &base
  image: python:3.11-slim
  environment: {MARK: "${MARK:-unset}"}
services:
  slow:
    <<: *base
    command: ["python", "-c", "import os, time; open('slow.pid', 'w').write(str(os.getpid())); time.sleep(1.0); open('slow.ready', 'w'); print('slow ready', flush=True); time.sleep(120)"]
    healthcheck: {test: ["CMD-SHELL", "test -f slow.ready"], interval: 1s}
  after:
    <<: *base
    command: ["python", "-c", "import os, sys; print('after sees', os.path.exists('slow.ready'), os.environ['MARK']); sys.exit(7)"]
    depends_on: {slow: {condition: service_healthy}}
""")
    code, out = up(["-f", compose, "--exit-code-from", "after", "--no-color"], env={"MARK": "m1"})
    assert code == 7, out
    assert "after  | after sees True m1" in out and "slow   | slow ready" in out
    assert "zmqflow up: after exited with code 7" in out and "zmqflow up: slow exited with code" in out
    assert gone(int((tmp_path / "slow.pid").read_text()))


def test_a_dependency_that_fails_stops_the_run(tmp_path):
    compose = write(tmp_path, """
services:
  bad:
    image: python:3.11-slim
    command: ["python", "-c", "import sys; sys.exit(3)"]
    healthcheck: {test: ["CMD", "false"], interval: 1s}
  waiting:
    image: python:3.11-slim
    command: ["python", "-c", "print('must not run')"]
    depends_on: {bad: {condition: service_healthy}}
""")
    code, out = up(["-f", compose])
    assert code == 1, out
    assert "zmqflow up: bad exited with code 3" in out
    assert "waiting cannot start: bad is unhealthy (it exited before its healthcheck passed)" in out
    assert "must not run" not in out


def test_sigterm_stops_every_process_group(tmp_path):
    compose = write(tmp_path, """
services:
  long:
    image: python:3.11-slim
    command: ["sh", "-c", "sleep 300 & echo $$! > grandchild.pid; echo $$$$ > long.pid; wait"]
""")
    proc = subprocess.Popen([ZMQFLOW, "up", "-f", compose], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        def started():
            assert proc.poll() is None, "zmqflow up exited before its service started"
            return (tmp_path / "long.pid").exists() and (tmp_path / "grandchild.pid").exists()
        wait_for(started, 20, "the service and its grandchild to write their pids")
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert "SIGTERM, stopping every service" in out and "zmqflow up: long exited with code" in out
    for name in ("long.pid", "grandchild.pid"):
        assert gone(int((tmp_path / name).read_text().strip())), name


def test_bad_file_and_options_are_reported(tmp_path):
    code, out = up(["-f", str(tmp_path / "missing.yml")])
    assert code == 1 and "does not exist" in out
    code, out = up(["-f", COMPOSE, "--exit-code-from", "nope", "--dry-run"])
    assert code == 2 and "'nope' is not among the services run" in out


@pytest.mark.faults
@pytest.mark.parametrize("role", ["broker", "ps0", "worker1"])
def test_a_killed_task_ends_the_job_naming_it_and_no_process_survives(project, tmp_path, role):
    """The job-ends-always rule under zmqflow up: SIGKILL one task mid-training; the run stops every
    other service, exits 137 (128 + SIGKILL) naming the task and its last lines, and leaves no process.
    The runner treats every service alike, so three roles stand for all here: the one every other
    depends on, a ps, a non-chief worker (each role's own reaction: tests/integration/test_job_ends.py)."""
    import queue
    import threading
    offset = free_port_offset(compose_ports(project))
    proc = subprocess.Popen([ZMQFLOW, "up", "-f", COMPOSE, "--port-offset", str(offset), "--workdir", str(tmp_path),
                             "--abort-on-failure", "--timeout", "4", "--services", ",".join(TRAINING)], cwd=ROOT,
                            env={**os.environ, "EPOCHS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, out = queue.Queue(), []
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    pids = {}
    try:
        deadline = time.monotonic() + 60
        while not (set(pids) >= set(TRAINING) - {"data"} and any("Step:" in line for line in out)):
            assert time.monotonic() < deadline, "training did not start within 60 s:\n" + "".join(out[-40:])
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            out.append(line)
            started = re.match(r"zmqflow up: started (\S+) \(pid (\d+)\)", line)
            if started:
                pids[started.group(1)] = int(started.group(2))
        os.kill(pids[role], signal.SIGKILL)
        code = proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    time.sleep(0.5)
    while not lines.empty():
        out.append(lines.get())
    text = "".join(out)
    assert code == 137, text[-3000:]
    assert f"zmqflow up: {role} failed: it was killed by signal 9; stopping every service. Its last log lines:" in text
    assert all(gone(pid) for pid in pids.values())


def test_volumes_default_to_dot_zmqflow_up_beside_the_compose_file():
    """The keys outlive the run where docs and host clients look for them: .zmqflow-up/zmqflow-keys."""
    code, out = up(["-f", COMPOSE, "--dry-run", "--no-deps", "keys"])
    keys = os.path.join(os.path.dirname(os.path.abspath(COMPOSE)), ".zmqflow-up", "zmqflow-keys")
    assert code == 0 and f"zmqflow keys generate {keys} " in out, out
