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
SERVING = ("serve0", "serve1", "serve2", "aggregator")


def loadtest(stack, tmp_path, *extra, duration=5):
    report = tmp_path / f"load-{time.monotonic_ns()}.json"
    argv = [ZMQFLOW, "loadtest", "--address", f"tcp://127.0.0.1:{stack.port}", "--rate", "100", "--duration",
            str(duration), "--deadline-ms", "1000", "--json-out", str(report), *extra]
    return argv, report


def test_training_runs_to_completion_and_every_training_service_exits_0(stack):
    for service in TRAINING:
        state = stack.container(service)["State"]
        assert state["Status"] == "exited" and state["ExitCode"] == 0, (service, state)
    chief = stack("logs", "--no-color", "worker0").stdout
    assert "test metrics: accuracy" in chief and "checkpoint saved" in chief   # the data spec's test split


def test_serving_is_healthy_on_the_final_checkpoint(stack):
    for service in SERVING:
        assert stack.container(service)["State"]["Health"]["Status"] == "healthy", service
    info = json.loads(run([ZMQFLOW, "ping", "--json", f"tcp://127.0.0.1:{stack.port}"]).stdout)
    assert info["service"] == "aggregator"


def test_load_through_the_published_port_has_no_failures(stack, tmp_path):
    argv, report = loadtest(stack, tmp_path, "--max-failures", "0")
    done = run(argv, timeout=120)
    overall = json.loads(report.read_text())["overall"]
    print(f"\nload through 127.0.0.1:{stack.port}: {overall}")
    assert overall["failed"] == 0 and overall["requests"] >= 400, done.stdout


def test_load_test_profile_answers_without_failures(stack):
    done = stack("--profile", "loadtest", "run", "--rm", "loadtest", timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "overall" in done.stdout
    for service in ("worker0", "broker"):   # `run` did not start the finished training job again
        assert stack.container(service)["State"]["Status"] == "exited", service


@pytest.mark.faults
def test_a_killed_model_server_leaves_the_ensemble_answering_within_its_deadline(stack, tmp_path):
    argv, report = loadtest(stack, tmp_path, duration=8)
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
