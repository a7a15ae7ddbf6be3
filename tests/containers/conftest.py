import os
import time

import pytest

from tests.containers.docker import ROOT, ComposeProject, run, why_no_docker
from tests.support import free_port

IMAGE = os.environ.get("ZMQFLOW_TEST_IMAGE", "zmqflow:test")


@pytest.fixture(scope="session")
def docker():
    reason = why_no_docker()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def image(docker):
    """The image built from this checkout (the layer cache makes a rebuild quick). --network host
    lets pip reach the package index where containers have no network of their own."""
    started = time.monotonic()
    run(["docker", "build", "--network", "host", "-t", IMAGE, ROOT], timeout=1800)
    print(f"\nimage {IMAGE} built in {time.monotonic() - started:.0f} s")
    return IMAGE


@pytest.fixture(scope="module")
def stack(image, tmp_path_factory):
    """docker-compose.yml brought up cold (1 epoch) under a project of its own; taken down with -v
    whatever happens. `stack.cold_start_s`: from `up -d` to the aggregator healthy; `stack.gateway_port`,
    `stack.gateway_grpc_port` and `stack.dashboard_port`: the gateway's HTTP and gRPC ports and the web view's on
    the host's loopback. `stack.client_env`:
    the environment of a client on the host (the deployment's CURVE keys, copied out of a container)."""
    port, gateway_port, gateway_grpc_port, dashboard_port = free_port(), free_port(), free_port(), free_port()
    project = ComposeProject(f"zmqflowtest{os.getpid()}", {"ZMQFLOW_IMAGE": image, "EPOCHS": "1",
                                                          "ZMQFLOW_AGGREGATOR_PORT": str(port),
                                                          "ZMQFLOW_GATEWAY_PORT": str(gateway_port),
                                                          "ZMQFLOW_GATEWAY_GRPC_PORT": str(gateway_grpc_port),
                                                          "ZMQFLOW_DASHBOARD_PORT": str(dashboard_port),
                                                          "LOADTEST_DURATION": "5"})
    project.port, project.gateway_port, project.dashboard_port = port, gateway_port, dashboard_port
    project.gateway_grpc_port = gateway_grpc_port
    project.down()
    started = time.monotonic()
    try:
        project("up", "-d", timeout=900)
        project.wait_healthy("aggregator", 300)
        project.cold_start_s = time.monotonic() - started
        print(f"\ncold start to serving (up -d until the aggregator is healthy): {project.cold_start_s:.1f} s")
        keys = str(tmp_path_factory.mktemp("compose") / "keys")
        run(["docker", "cp", f"{project.container('aggregator')['Id']}:/keys", keys])
        project.client_env = {**os.environ, "ZMQFLOW_CURVE_DIR": keys}
        yield project
    finally:
        project.down()
