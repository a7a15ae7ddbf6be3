"""Soak: the serving services driven at full rate, each sampled while it serves (tests/support/soak.py).

A model server over a checkpoint of the MNIST MLP, an aggregator in front of it, and the HTTP gateway in front of
the aggregator, all on loopback; each test drives one of them directly with 16 requests in flight (the gateway over
keep-alive connections), as fast as it answers, for ZMQFLOW_SOAK_SECS.

The model server and the aggregator are driven twice: as they run, and again with Python's cyclic collector off
(tests/support/collector_off.py) and requests of 64 rows (200 KB): a request must be freed by reference counting
alone. Issue 27: each of the aggregator's parked calls and its Gather referred to each other, so an answered request
was freed only by the collector, and those that reached its oldest generation waited there for a full collection;
the RSS rose by some MB and stayed, which looked like a creep (54 -> 61 MB over 255,000 requests) but levelled off.
With the collector off that cycle kept every request, and its 200 KB, for ever: that soak fails on it within
seconds. (The gateway's asyncio and HTTP stack are left with their collector: their cycles are not ours to break.)
"""

import os

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient
from tests.support.collector_off import MODULE_ENV
from tests.support.soak import Sampler, check, drive, soak_seconds, soak_timeout

pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(soak_timeout())]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WINDOW = 16
DEADLINE_MS = 10_000   # a loaded machine is slow, not broken: no request should time out


@pytest.fixture(scope="module")
def serving(tmp_path_factory, module_processes):
    """{name: process}: a model server, an aggregator over it, and both commands again with the collector off."""
    checkpoint = str(tmp_path_factory.mktemp("checkpoint"))
    write_random_checkpoint(checkpoint, 1)
    server_args = ["--checkpoint", checkpoint, "--backend", "numpy", "--max-delay-secs", "0", "--model-name", "m1"]
    server = module_processes.service("zmqflow.services.serve", server_args)
    aggregator_args = ["--member", server.endpoint, "--deadline-ms", str(DEADLINE_MS)]
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

    def collector_off(module, args, name):
        return module_processes.service("tests.support.collector_off", args, name=name,
                                        env={MODULE_ENV: module, "PYTHONPATH": path})
    return {"model server": server,
            "aggregator": module_processes.service("zmqflow.services.aggregator", aggregator_args),
            "model server, collector off": collector_off("zmqflow.services.serve", server_args, "serve-collector-off"),
            "aggregator, collector off": collector_off("zmqflow.services.aggregator", aggregator_args,
                                                       "aggregator-collector-off")}


def rows(n):
    return np.random.default_rng(0).random((n, 784), dtype=np.float32)


def soak(name, process, client, submit):
    seconds = soak_seconds()
    with Sampler({name: process.pid}) as sampler:
        answered, errors = drive(submit, client.rpc.poll, seconds, WINDOW)
    assert not errors, f"{len(errors)} of {answered + len(errors)} requests failed, e.g. {errors[0]!r}"
    check(name, sampler, answered, "requests", seconds)


def test_model_server(serving):
    server, x = serving["model server"], rows(1)
    with ModelClient(server.endpoint, timeout=DEADLINE_MS / 1000, name="soak") as client:
        soak("model server", server, client, lambda: client.predict_async(x))


def test_aggregator(serving):
    aggregator, x = serving["aggregator"], rows(1)
    with AggregatorClient(aggregator.endpoint, timeout=DEADLINE_MS / 1000, name="soak") as client:
        soak("aggregator", aggregator, client, lambda: client.predict_async(x, deadline_ms=DEADLINE_MS))


@pytest.mark.parametrize("service", ["model server", "aggregator"])
def test_each_request_is_freed_without_the_cyclic_collector(serving, service):
    name = f"{service}, collector off"
    process, x = serving[name], rows(64)
    if service == "model server":
        with ModelClient(process.endpoint, timeout=DEADLINE_MS / 1000, name="soak") as client:
            soak(name, process, client, lambda: client.predict_async(x))
    else:
        with AggregatorClient(process.endpoint, timeout=DEADLINE_MS / 1000, name="soak") as client:
            soak(name, process, client, lambda: client.predict_async(x, deadline_ms=DEADLINE_MS))


def test_gateway(serving, module_processes):
    pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")
    from zmqflow.loadtest.http_target import HttpTarget, json_body, model_metadata, random_body
    gateway = module_processes.service("zmqflow.services.gateway", ["--aggregator", serving["aggregator"].endpoint],
                                       bind="127.0.0.1:0")
    body = json_body(random_body(model_metadata(gateway.endpoint, "ensemble"), 1))
    target = HttpTarget(gateway.endpoint, "ensemble", DEADLINE_MS, connections=WINDOW, timeout_s=DEADLINE_MS / 1000)
    seconds = soak_seconds()
    try:
        with Sampler({"gateway": gateway.pid}) as sampler:
            answered, errors = drive(lambda: target.submit(body), target.poll, seconds, WINDOW)
    finally:
        target.close()
    assert not errors, f"{len(errors)} of {answered + len(errors)} requests failed, e.g. {errors[0]!r}"
    check("gateway", sampler, answered, "requests", seconds)
