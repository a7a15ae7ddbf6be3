"""Admin ops (shutdown, init, restore, reset, and an aggregator's add_member and remove_member) need a credential in every mode: a real broker and ps without
CURVE refuse a local client with no token (UNAUTHENTICATED) or a wrong one (PERMISSION_DENIED), change
nothing, count it, and keep serving; the job's token (or the one the service wrote) works; over CURVE
an authorized client key is the credential."""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.common.rpc import admin_token
from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.errors import FailedPreconditionError, PermissionDeniedError, UnauthenticatedError
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.common.rpc.client import RpcClient
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP
from tests.ops.helpers import scrape, value
from tests.support import wait_for

pytestmark = pytest.mark.service


def missing(op, service, endpoint):
    """The exact answer to an admin op sent without a token."""
    return (f"{op} on the {service} at {endpoint} is an admin op: it needs the admin token (set {admin_token.ENV}, "
            f"or {admin_token.FILE_ENV} / --admin-token-file; a service that made its own wrote it to "
            f"{admin_token.token_file(endpoint)}) or a CURVE client key granted the admin role")


def wrong(op, service, endpoint):
    return f"{op} on the {service} at {endpoint}: wrong admin token"


def refused(endpoint, op, args=None, tensors=(), credential="admin_token"):
    """(error without a token, error with a wrong one) of one admin op (`credential` job_token: a member op),
    each from a fresh local client."""
    errors = []
    for token, expected in ((None, UnauthenticatedError), ("not-the-token", PermissionDeniedError)):
        with RpcClient(endpoint, **{credential: token}) as client, pytest.raises(expected) as caught:
            client.call(op, args, tensors, timeout=5)
        errors.append(str(caught.value))
    return errors


@pytest.fixture(scope="module")
def broker(module_processes):
    return module_processes.service("zmqflow.services.broker", ["--metrics-bind", "0"])


@pytest.fixture(scope="module")
def ps(module_processes):
    return module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])


def test_the_broker_refuses_reset_without_the_token_and_keeps_its_queues(broker):
    queue = FIFOQueue(10, ["int32"], shared_name="kept", container="c", broker=broker.endpoint)
    queue.enqueue_many([np.arange(3, dtype=np.int32)])
    for op in ("reset", "shutdown"):
        assert refused(broker.endpoint, op, {"container": "c"}) == [missing(op, "queue-broker", broker.endpoint),
                                                                    wrong(op, "queue-broker", broker.endpoint)]
    assert broker.alive() and queue.size() == 3                       # nothing changed, still serving
    with RpcClient(broker.endpoint) as client:
        info = client.call("info", timeout=5)[0]
    samples = scrape(info["metrics"])
    assert info["stats"]["admin_refused"] == 4
    for code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        assert value(samples, "zmqflow_rpc_requests_total", op="reset", code=code) == 1
    with BrokerClient(broker.endpoint) as client:                     # the job's token (this test's Supervisor)
        assert client.reset("c")["freed"] == 1
        assert client.list_queues() == []


def test_the_ps_refuses_init_restore_and_shutdown_without_the_token(ps, tmp_path):
    placement = place(model_variables(MNIST_MLP), 1)
    initial = load_model(MNIST_MLP).initial_values(1)
    pieces = {}
    for name, array in initial.items():
        pieces.update(placement.split(name, array))
    names = [p.key for p in placement.for_shard(0)]
    init = ({"step": 0, "names": names}, [pieces[n] for n in names])
    for op, args, tensors in (("init", *init), ("restore", {"dir": str(tmp_path)}, ()), ("shutdown", {}, ())):
        assert refused(ps.endpoint, op, args, tensors) == [missing(op, "ps-shard", ps.endpoint),
                                                           wrong(op, "ps-shard", ps.endpoint)]
    with RpcClient(ps.endpoint) as client:
        assert client.call("stats", timeout=5)[0]["initialized"] is False   # the refused init changed nothing
        with pytest.raises(FailedPreconditionError):
            client.call("pull", timeout=5)
    shards = PsClient([ps.endpoint], placement)                      # the chief: the job's token
    try:
        shards.initialize(initial)
        forced = ({**init[0], "force": True}, [np.zeros_like(t) for t in init[1]])
        refused(ps.endpoint, "init", *forced)                        # a rogue re-initialisation
        np.testing.assert_array_equal(shards.pull()["hidden/weights"], initial["hidden/weights"])
        assert ps.alive()
    finally:
        shards.close()


def test_the_aggregator_refuses_add_and_remove_member_without_the_token(module_processes):
    member, rogue = "tcp://127.0.0.1:7", "tcp://127.0.0.1:9"   # nothing listens there: membership alone is tested
    aggregator = module_processes.service("zmqflow.services.aggregator", ["--member", member])
    for op, args in (("add_member", {"address": rogue}), ("remove_member", {"address": member})):
        assert refused(aggregator.endpoint, op, args) == [missing(op, "aggregator", aggregator.endpoint),
                                                          wrong(op, "aggregator", aggregator.endpoint)]
    with AggregatorClient(aggregator.endpoint) as client:             # nothing changed; the job's token works
        assert [m["address"] for m in client.members()] == [member]
        client.add_member(rogue)
        assert sorted(m["address"] for m in client.members()) == [member, rogue]
        client.remove_member(rogue)


def test_shutdown_with_the_job_token_stops_the_services(processes):
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    refused(broker.endpoint, "shutdown")
    refused(ps.endpoint, "shutdown")
    assert broker.alive() and ps.alive()
    with BrokerClient(broker.endpoint) as client:
        client.shutdown()
    PsClient([ps.endpoint], place(model_variables(MNIST_MLP), 1)).shutdown()
    assert broker.proc.wait(10) == 0 and ps.proc.wait(10) == 0


def zmqflow(*args, env=None):
    clean = {k: v for k, v in os.environ.items() if k not in (admin_token.ENV, admin_token.FILE_ENV)}
    return subprocess.run([sys.executable, "-m", "zmqflow", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def test_a_service_given_no_token_writes_one_that_the_shutdown_command_reads(tmp_path):
    broker = start_service("zmqflow.services.broker", env={admin_token.ENV: ""}, log_dir=str(tmp_path))
    try:
        path = admin_token.token_file(broker.endpoint)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert f"admin token for this service's reset/shutdown written to {path}" in broker.log()
        out = zmqflow("shutdown", "--address", broker.endpoint, env={admin_token.ENV: "not-the-token"})
        assert out.returncode == 1 and f"PermissionDeniedError: {wrong('shutdown', 'queue-broker', broker.endpoint)}" \
            in out.stderr, out.stderr
        out = zmqflow("shutdown", "--address", broker.endpoint)                   # the file the broker wrote
        assert out.returncode == 0 and "queue-broker" in out.stdout, out.stderr
        assert broker.proc.wait(10) == 0
        assert not os.path.exists(path)                              # a clean exit takes its file away
    finally:
        broker.stop()


def test_a_token_file_given_to_the_service_and_the_command(tmp_path):
    (tmp_path / "token").write_text("a-token-of-my-own\n")
    ps = start_service("zmqflow.services.ps", ["--admin-token-file", str(tmp_path / "token")],
                       env={admin_token.ENV: ""}, log_dir=str(tmp_path))
    try:
        assert not os.path.exists(admin_token.token_file(ps.endpoint))   # nothing written: the token was given
        out = zmqflow("shutdown", "--address", ps.endpoint)
        assert out.returncode == 1 and "UnauthenticatedError" in out.stderr, out.stderr
        out = zmqflow("shutdown", "--admin-token-file", str(tmp_path / "token"), "--address", ps.endpoint)
        assert out.returncode == 0, out.stderr
        assert ps.proc.wait(10) == 0
    finally:
        ps.stop()


def test_over_curve_an_authorized_client_needs_no_token(processes, keys):
    broker = processes.service("zmqflow.services.broker", ["--curve-dir", keys["keys"]])
    with BrokerClient(broker.endpoint, curve_dir=keys["keys"], admin_token=None) as client:
        assert client.info()["curve"] is True
        client.shutdown()
    wait_for(lambda: not broker.alive(), 10, "the broker to exit")
    assert broker.returncode == 0
