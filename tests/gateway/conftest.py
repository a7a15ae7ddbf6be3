"""One topology for every gateway test: model servers m1, m2, m3 (m3 may be paused by a test), an aggregator
over the three, a gateway in front of it and one in front of m1 alone (each also serving gRPC where grpcio is
installed); all stopped by PID after the package."""

import importlib.util
from dataclasses import dataclass

import pytest

from zmqflow.bench.serve import write_random_checkpoint
from tests.support import Processes, free_port

GATEWAY_LIMITS = ["--max-body-bytes", "2000000", "--header-timeout-secs", "1", "--body-timeout-secs", "1",
                  "--refresh-secs", "0.3"]


@dataclass
class Topology:
    members: dict      # name -> process of a model server
    aggregator: object
    gateway: str       # URL of the gateway over the aggregator
    single: str        # URL of the gateway over m1 alone
    grpc: str = None         # HOST:PORT of the gateway over the aggregator's gRPC service (None without grpcio)
    grpc_single: str = None  # HOST:PORT of the gateway over m1's gRPC service
    gateway_pid: int = None  # the gateway over the aggregator's process


@pytest.fixture(scope="package")
def topology(tmp_path_factory):
    pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")
    registry = Processes(str(tmp_path_factory.mktemp("gateway")))
    try:
        members = {}
        for seed, name in enumerate(("m1", "m2", "m3"), start=1):
            ckpt = str(tmp_path_factory.mktemp(f"ckpt-{name}"))
            write_random_checkpoint(ckpt, seed)
            members[name] = registry.service("zmqflow.services.serve", ["--checkpoint", ckpt, "--backend", "numpy",
                                                                        "--max-delay-secs", "0", "--model-name", name])
        aggregator = registry.service("zmqflow.services.aggregator",
                                      [a for p in members.values() for a in ("--member", p.endpoint)] +
                                      ["--deadline-ms", "3000"])
        grpc = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"] if importlib.util.find_spec("grpc") else []
        gateway = registry.service("zmqflow.services.gateway", ["--aggregator", aggregator.endpoint, *GATEWAY_LIMITS,
                                                                *(["--grpc-bind", grpc[0]] if grpc else [])],
                                   bind="127.0.0.1:0")
        single = registry.service("zmqflow.services.gateway", ["--serve", members["m1"].endpoint, *GATEWAY_LIMITS,
                                                               *(["--grpc-bind", grpc[1]] if grpc else [])],
                                  bind="127.0.0.1:0")
        yield Topology(members, aggregator, gateway.endpoint, single.endpoint, *grpc, gateway_pid=gateway.pid)
    finally:
        registry.stop_all()
