"""The image as built: the wheel's commands, non-root, zmqflow as entrypoint, labels, a real HEALTHCHECK."""

import json
import time

import pytest

import zmqflow
from tests.containers.docker import run

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(600)]


def test_entrypoint_version_user_and_labels(image):
    config = json.loads(run(["docker", "image", "inspect", image]).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["zmqflow"] and config["Cmd"] == ["--help"]
    assert config["User"] == "zmqflow"
    assert config["Labels"]["org.opencontainers.image.version"] == zmqflow.__version__
    assert config["Healthcheck"]["Test"] == ["CMD", "zmqflow", "healthcheck"]
    assert run(["docker", "run", "--rm", image, "--version"]).stdout.strip().endswith(zmqflow.__version__)
    assert run(["docker", "run", "--rm", "--entrypoint", "id", image, "-u"]).stdout.strip() == "10001"
    size = int(json.loads(run(["docker", "image", "inspect", image]).stdout)[0]["Size"])
    print(f"\nimage {image}: {size / 1e6:.0f} MB")


def test_every_command_of_the_wheel_runs(image):
    """The first wave's image failed every command with ModuleNotFoundError: each must start."""
    commands = "broker ps worker reader serve aggregator gateway loadtest up status train sweep ensemble data healthcheck bench k8s"
    done = run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c",
                f"for c in {commands}; do zmqflow $c --help >/dev/null || {{ echo \"zmqflow $c failed\"; exit 1; }}; done"],
               check=False, timeout=300)
    assert done.returncode == 0, f"in the image: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    listing = run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c",
                   "import os, zmqflow.inputs.datasets as d; print(len(os.listdir(d.DATA_DIR)) > 0)"])
    assert listing.stdout.strip() == "True"   # the package data came with the wheel
    # no build tools or source tree in the final stage
    assert run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c",
                "command -v gcc || ls /src 2>/dev/null || echo clean"]).stdout.strip() == "clean"


def test_healthcheck_follows_the_service(image):
    name = f"zmqflow-health-{time.monotonic_ns()}"
    run(["docker", "run", "-d", "--name", name, "--health-interval", "1s", image, "broker", "--bind",
         "tcp://0.0.0.0:5555", "--insecure"])   # no CURVE beyond loopback is refused without --insecure
    try:
        deadline = time.monotonic() + 60
        while True:
            state = json.loads(run(["docker", "inspect", name]).stdout)[0]["State"]
            if state["Health"]["Status"] == "healthy":
                break
            assert state["Status"] == "running" and time.monotonic() < deadline, state
            time.sleep(0.5)
        check = run(["docker", "exec", name, "zmqflow", "healthcheck"])
        assert "queue-broker up" in check.stdout
        run(["docker", "exec", name, "sh", "-c", "echo tcp://127.0.0.1:5999 > $ZMQFLOW_HEALTH_FILE"])
        assert run(["docker", "exec", name, "zmqflow", "healthcheck", "--timeout-secs", "0.5"], check=False).returncode == 1
    finally:
        run(["docker", "rm", "-f", "-v", name], check=False)   # -v: its anonymous /data volume too
