"""docker-compose.yml for real: cold start, training to completion, serving, load through the
published port and through the load-test profile, a model server killed under load, and down -v."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.containers.docker import run

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(1500)]

ZMQFLOW = os.path.join(os.path.dirname(sys.executable), "zmqflow")
TRAINING = ("data", "broker", "ps0", "ps1", "reader", "worker0", "worker1")
SERVING = ("serve0", "serve1", "serve2", "aggregator", "gateway")


def loadtest(stack, tmp_path, *extra, duration=5):
    report = tmp_path / f"load-{time.monotonic_ns()}.json"
    argv = [ZMQFLOW, "loadtest", "--address", f"tcp://127.0.0.1:{stack.port}", "--rate", "100", "--duration-secs",
            str(duration), "--deadline-ms", "1000", "--json-out", str(report), *extra]
    return argv, report


def test_training_runs_to_completion_and_every_training_service_exits_0(stack):
    for service in TRAINING:
        state = stack.container(service)["State"]
        assert state["Status"] == "exited" and state["ExitCode"] == 0, (service, state)
    chief = stack("logs", "--no-color", "worker0").stdout
    assert "test metrics: accuracy" in chief and "checkpoint saved" in chief   # the data spec's test split


def test_serving_is_healthy_on_the_final_checkpoint(stack):
    started = time.monotonic()
    stack.wait_healthy("gateway", 120)
    print(f"\ngateway healthy {time.monotonic() - started:.1f} s after the aggregator")
    for service in SERVING:
        assert stack.container(service)["State"]["Health"]["Status"] == "healthy", service
    info = json.loads(run([ZMQFLOW, "ping", "--json", "--address", f"tcp://127.0.0.1:{stack.port}"], env=stack.client_env).stdout)
    assert info["service"] == "aggregator" and info["curve"] is True      # CURVE by default (the keys service)
    refused = run([ZMQFLOW, "ping", "--timeout-secs", "2", "--address", f"tcp://127.0.0.1:{stack.port}"], check=False,
                  env={k: v for k, v in stack.client_env.items() if k != "ZMQFLOW_CURVE_DIR"})
    assert refused.returncode == 1, refused.stdout                       # a client without the keys: no answer


def test_load_through_the_published_port_has_no_failures(stack, tmp_path):
    argv, report = loadtest(stack, tmp_path, "--max-failures", "0")
    done = run(argv, timeout=120, env=stack.client_env)
    overall = json.loads(report.read_text())["overall"]
    print(f"\nload through 127.0.0.1:{stack.port}: {overall}")
    assert overall["failed"] == 0 and overall["requests"] >= 400, done.stdout


def test_load_test_profile_answers_without_failures(stack):
    done = stack("--profile", "loadtest", "run", "--rm", "loadtest", timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "overall" in done.stdout
    for service in ("worker0", "broker"):   # `run` did not start the finished training job again
        assert stack.container(service)["State"]["Status"] == "exited", service


def test_curl_and_tritonclient_get_predictions_through_the_gateway(stack):
    """The shipped topology's gateway on the host's loopback: `curl` (JSON tensors) and tritonclient.http
    (binary tensors) get predictions from the ensemble and from single members (model, model-2, model-3: the
    three servers share the name `model`)."""
    import numpy as np
    import tritonclient.http as httpclient
    address = f"127.0.0.1:{stack.gateway_port}"
    x = np.random.default_rng(0).random((2, 784), dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    curl = shutil.which("curl")
    for model in ("ensemble", "model"):
        url = f"http://{address}/v2/models/{model}/infer"
        if curl:
            done = run([curl, "-sS", "--fail-with-body", "--max-time", "10", url, "-H", "Content-Type: application/json",
                        "-H", "X-Zmqflow-Deadline-Ms: 1000", "-d", body])
            answer = json.loads(done.stdout)
        else:   # what curl sends, from Python
            import urllib.request
            request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json",
                                                                  "X-Zmqflow-Deadline-Ms": "1000"})
            answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
        [output] = answer["outputs"]
        print(f"\n{'curl' if curl else 'urllib'} -> {model}: {answer['parameters']}")
        assert answer["model_name"] == model and output["shape"] == [2, 10], answer
        assert np.allclose(np.reshape(output["data"], (2, 10)).sum(axis=1), 1.0, atol=1e-4)
        if model == "ensemble":
            assert answer["parameters"]["answered_count"] >= 1, answer
    client = httpclient.InferenceServerClient(address, network_timeout=10.0)
    try:
        assert client.is_server_ready() and client.is_model_ready("model-3")
        for model in ("ensemble", "model-3"):
            timed_infers(httpclient, client, model, x, timeout=1_000_000)   # microseconds
    finally:
        client.close()


def timed_infers(tritonclient, client, model, x, **deadline):
    """50 `client.infer` calls of the rows `x` to `model` with tritonclient's http or grpc module (the same calls;
    the deadline's keyword differs): the last one's probabilities checked, p50 and p99 printed."""
    import numpy as np
    data = tritonclient.InferInput("input", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    timings = []
    for _ in range(50):
        started = time.perf_counter()
        result = client.infer(model, [data], **deadline)
        timings.append((time.perf_counter() - started) * 1000)
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (len(x), 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4), model
    print(f"\n{tritonclient.__name__} -> {model}: 50 infers, p50 {np.percentile(timings, 50):.2f} ms, "
          f"p99 {np.percentile(timings, 99):.2f} ms")


def test_tritonclient_grpc_gets_predictions_through_the_gateways_grpc_port(stack):
    """The image serves the gRPC side too (its lock installs the grpc extra): on the port compose publishes,
    tritonclient.grpc gets predictions from the ensemble and from a member, and the standard health service that
    Kubernetes' gRPC probe asks answers SERVING."""
    import grpc
    import numpy as np
    import tritonclient.grpc as grpcclient
    address = f"127.0.0.1:{stack.gateway_grpc_port}"
    x = np.random.default_rng(0).random((2, 784), dtype=np.float32)
    stack.wait_healthy("gateway", 120)   # run alone, the stack is up once the aggregator is healthy
    with grpcclient.InferenceServerClient(address) as client:
        assert client.is_server_ready() and client.is_model_ready("model-3")
        for model in ("ensemble", "model-3"):
            timed_infers(grpcclient, client, model, x, client_timeout=5)   # seconds
    with grpc.insecure_channel(address) as channel:   # HealthCheckRequest{} -> HealthCheckResponse{status: SERVING}
        assert channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5) == b"\x08\x01"


def test_load_test_profile_drives_the_gateway_over_http(stack):
    done = stack("--profile", "loadtest", "run", "--rm", "loadtest-http", timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "overall" in done.stdout and "(JSON tensors)" in done.stdout, done.stdout[-3000:]
    print(f"\nloadtest-http (compose profile):\n{done.stdout[-1500:]}")


def test_the_dashboard_profile_shows_the_topology_in_the_web_view(stack):
    """`--profile dashboard`: `zmqflow status --web` in the image (http extra) on the host's loopback; after
    training, the serving tasks are up and the finished training tasks down."""
    import urllib.request
    try:
        stack("--profile", "dashboard", "up", "-d", "dashboard", timeout=300)
        stack.wait_healthy("dashboard", 120)
        base = f"http://127.0.0.1:{stack.dashboard_port}"
        page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "/static/uPlot.iife.min.js" in page and "://" not in page, page[:2000]   # nothing from elsewhere
        tasks = json.loads(urllib.request.urlopen(base + "/api/snapshot", timeout=10).read())["snapshot"]["tasks"]
        status = {t["task"]: t["status"] for t in tasks}
        print(f"\ndashboard: {status}")
        assert {k: status.get(k) for k in ("serve:0", "serve:1", "serve:2", "aggregator:0")} == \
            dict.fromkeys(("serve:0", "serve:1", "serve:2", "aggregator:0"), "up"), status
        assert status["broker:0"] == "down" and status["ps:0"] == "down"   # training ended: they exited 0
    finally:
        stack("--profile", "dashboard", "rm", "-sf", "dashboard", timeout=120, check=False)


KILL_MAIN = ("import os, signal\n"
             "for p in os.listdir('/proc'):\n"
             "    if p.isdigit() and int(p) not in (1, os.getpid()):\n"
             "        try:\n"
             "            fields = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()\n"
             "        except OSError:\n"
             "            continue\n"
             "        if fields[1] == '1':\n"
             "            os.kill(int(p), signal.SIGKILL)\n")
"""SIGKILL to the service's process (the child of the image's init), as a crash: `docker kill` would count as a
stop by hand, which `restart: unless-stopped` respects."""


def _answers_in(stack, service):
    """Whether `service` answers now: its own ping inside its container (model servers, aggregator: the
    deployment's keys are there) or the gateway's readiness route on the host."""
    if service == "gateway":
        import urllib.request
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway_port}/v2/health/ready", timeout=1).status == 200
        except OSError:
            return False
    port = {"aggregator": 5800}.get(service) or 5700 + int(service[-1])
    done = run(["docker", "exec", stack.container(service)["Id"], "zmqflow", "ping", "--timeout", "1",
                f"tcp://127.0.0.1:{port}"], check=False, timeout=30)
    return done.returncode == 0


@pytest.mark.faults
def test_each_serving_service_killed_under_load_restarts_and_answers_again(stack, tmp_path):
    """restart: unless-stopped: each model server, the aggregator and the gateway, its process SIGKILLed under a
    client's load, is restarted by Docker; the gap from the kill until it answers again is printed and bounded."""
    argv, report = loadtest(stack, tmp_path, duration=60)
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=stack.client_env)
    gaps = {}
    try:
        time.sleep(2)
        for service in SERVING:
            restarts = stack.container(service)["RestartCount"]
            killed = time.monotonic()
            run(["docker", "exec", stack.container(service)["Id"], "python", "-c", KILL_MAIN], check=False)
            while not (stack.container(service)["RestartCount"] > restarts and _answers_in(stack, service)):
                assert time.monotonic() - killed < 60, f"{service} did not answer within 60 s of its kill"
                time.sleep(0.2)
            gaps[service] = time.monotonic() - killed
    finally:
        load.terminate()
        load.communicate(timeout=60)
    print("\ndocker compose, SIGKILL under load -> answering again: "
          + ", ".join(f"{name} {gap:.1f} s" for name, gap in gaps.items()))
    assert set(gaps) == set(SERVING) and all(gap < 60 for gap in gaps.values()), gaps
    for service in TRAINING:       # no restart policy: the finished training stays done
        state = stack.container(service)["State"]
        assert state["Status"] == "exited" and state["ExitCode"] == 0, service
    for service in SERVING:
        stack.wait_healthy(service, 120)


@pytest.mark.faults
def test_a_killed_model_server_leaves_the_ensemble_answering_within_its_deadline(stack, tmp_path):
    argv, report = loadtest(stack, tmp_path, duration=8)
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=stack.client_env)
    try:
        time.sleep(3)
        run(["docker", "kill", stack.container("serve1")["Id"]])
        out, _ = load.communicate(timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    result = json.loads(report.read_text())
    overall = result["overall"]
    print(f"\nload with serve1 killed after 3 s: {overall}")
    assert load.returncode == 0, out
    assert overall["failed"] == 0, out
    assert overall["p99_ms"] is not None and overall["p99_ms"] < 1000, out
    assert stack.container("serve1")["State"]["Status"] == "exited"


def test_user_files_are_mounted_read_only_on_the_python_path(stack, tmp_path):
    user = tempfile.mkdtemp(prefix="zmqflow-user-")   # not under pytest's 0700 folder: uid 10001 reads it
    try:
        os.chmod(user, 0o755)
        with open(os.path.join(user, "my_model.py"), "w") as f:
            f.write("WIDTH = 7\n")
        os.chmod(os.path.join(user, "my_model.py"), 0o644)
        script = ("import my_model; print('width', my_model.WIDTH)\n"
                  "try:\n    open('/user/new', 'w')\nexcept OSError as exc:\n    print('write:', exc.strerror)")
        done = stack("run", "--rm", "--no-deps", "--entrypoint", "python", "data", "-c", script,
                     env={"ZMQFLOW_USER_DIR": user}, timeout=300)
        assert "width 7" in done.stdout and "write: Read-only file system" in done.stdout, done.stdout + done.stderr
    finally:
        shutil.rmtree(user, ignore_errors=True)


def test_down_v_leaves_nothing(stack):
    assert any(stack.leftovers().values())
    done = stack.down()
    assert done.returncode == 0, done.stderr
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
