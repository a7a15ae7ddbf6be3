"""No peer does more than its role (issue 23, item 2), against real services over ZeroMQ.

Without CURVE a client without the job token is refused on every member op (UNAUTHENTICATED, a wrong
token PERMISSION_DENIED), changes nothing and the service keeps serving the job; with CURVE a key is
granted roles, so the gateway's (serving) key is served on client ops and refused on member and admin
ops. The ps confines what a member may do: `save` below its checkpoint root (no symbolic link),
`assign` to non-trainable pieces and through the non-finite policy, `preload` capped and never replacing."""

import json
import os
import re
import threading

import numpy as np
import pytest

from zmqflow.common.clients.ps import PsClient, PsShardClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.common.cluster.placement import place
from zmqflow.common.errors import (AlreadyExistsError, InvalidArgumentError, PermissionDeniedError,
                                   ResourceExhaustedError)
from zmqflow.common.rpc import admin_token, encryption as curve
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.wire.protocol import MEMBER_OPS, BrokerOps, PsOps, requests_of
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP
from tests.security.test_admin_ops_over_zmq import refused as refused_without
from tests.support import wait_for

pytestmark = pytest.mark.service
JOB = admin_token.JOB_TOKEN


def missing(op, service, endpoint):
    """The exact answer to a member op sent without the job token."""
    return (f"{op} on the {service} at {endpoint} is a member op: it needs the job token (set {JOB.env}, or "
            f"{JOB.file_env} / {JOB.option}; a service that made its own wrote it to "
            f"{admin_token.token_file(endpoint, JOB)}) or a CURVE client key granted the member role")


def refused(endpoint, op, args=None, tensors=()):
    """(error without the job token, error with a wrong one) of one member op, each from a fresh client."""
    return refused_without(endpoint, op, args, tensors, credential="job_token")


def stats(endpoint):
    with RpcClient(endpoint) as client:
        return client.call("info", timeout=5)[0]["stats"]


@pytest.fixture(scope="module")
def broker(module_processes):
    return module_processes.service("zmqflow.services.broker")


@pytest.fixture(scope="module")
def ps(module_processes, tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    shard = module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--checkpoint-root",
                                                             str(root), "--max-preload-bytes", "4000"])
    client = PsClient([shard.endpoint], place(model_variables(MNIST_MLP), 1))
    client.initialize(load_model(MNIST_MLP).initial_values(1))
    yield shard, client, root
    client.close()


def test_every_state_changing_op_is_a_member_op():
    for op in ("push", "push_sparse", "assign", "save", "preload", "worker_done", "pull", "take_rows", "enqueue",
               "enqueue_many", "dequeue", "dequeue_many", "close", "open_queue", "ack", "nack", "register_producer",
               "producer_failed"):
        assert op in MEMBER_OPS, op
    assert {"size", "is_closed", "list_queues", "producers", "stats", "wait_ready"}.isdisjoint(MEMBER_OPS)


def test_the_broker_refuses_member_ops_without_the_job_token_and_serves_the_job(broker):
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="mine", broker=broker.endpoint)   # the job's token
    queue.enqueue_many([np.arange(3, dtype=np.int32)])
    before = stats(broker.endpoint)["member_refused"]
    attacks = {"close": {"queue": queue.handle, "cancel_pending_enqueues": True}, "dequeue": {"queue": queue.handle},
               "enqueue": {"queue": queue.handle}, "open_queue": {"declaration": {}},
               "producer_failed": {"queue": queue.handle, "name": "x", "lease": 5, "code": 13, "error": "poison"}}
    for op, args in attacks.items():
        tensors = [np.array(7, dtype=np.int32)] if op == "enqueue" else ()
        assert refused(broker.endpoint, op, args, tensors) == [missing(op, "queue-broker", broker.endpoint),
                                                               f"{op} on the queue-broker at {broker.endpoint}: "
                                                               "wrong job token"]
    assert stats(broker.endpoint)["member_refused"] == before + 2 * len(attacks)
    with RpcClient(broker.endpoint, job_token=None) as anyone:        # read-only ops stay a client's
        assert anyone.call(BrokerOps.Size(queue.handle), timeout=5)[0]["size"] == 3
        assert [q["name"] for q in anyone.call(BrokerOps.ListQueues(), timeout=5)[0]["queues"]] == ["mine"]
    assert queue.size() == 3 and not queue.is_closed()                # nothing stolen, closed or poisoned
    np.testing.assert_array_equal(queue.dequeue_many(3), np.arange(3))


def test_the_ps_refuses_member_ops_without_the_job_token(ps, tmp_path):
    shard, client, root = ps
    before = client.pull()["hidden/biases"]
    ops = {"push": ({"version": 0, "names": ["hidden/biases"]}, [np.full(100, np.nan, np.float32)]),
           "assign": ({"names": ["hidden/biases"]}, [np.zeros(100, np.float32)]),
           "save": ({"dir": str(tmp_path)}, ()), "preload": ({"name": "x", "names": ["a"]}, [np.zeros(3)]),
           "worker_done": ({"replica": 0, "lost": True}, ()), "pull": ({}, ())}
    for op, (args, tensors) in ops.items():
        assert refused(shard.endpoint, op, args, tensors) == [missing(op, "ps-shard", shard.endpoint),
                                                              f"{op} on the ps-shard at {shard.endpoint}: "
                                                              "wrong job token"]
    np.testing.assert_array_equal(client.pull()["hidden/biases"], before)
    assert os.listdir(tmp_path) == [] and client.stats()[0]["done_workers"] == []
    assert {op for op, r in requests_of(PsOps).items() if r.ROLE == "member"} >= set(ops)


def test_save_is_confined_to_the_checkpoint_root_without_following_links(ps, tmp_path):
    shard, client, root = ps
    where = f"ps:0 saves checkpoints only in {root} (--checkpoint-root)"
    with pytest.raises(PermissionDeniedError, match=re.escape(f"{where}, not in '{tmp_path}'")):
        client.save(str(tmp_path))
    with pytest.raises(PermissionDeniedError, match=re.escape(f"{where}, not in")):
        client.save(str(root / ".." / "escape"))
    os.symlink(tmp_path, root / "link")                              # inside the root, pointing out of it
    with pytest.raises(PermissionDeniedError, match=re.escape(f"{where}, never through a symbolic link: "
                                                              f"'{root}/link' is one")):
        client.save(str(root / "link" / "ckpt"))
    assert os.listdir(tmp_path) == []
    path = client.save(str(root / "ckpt"))                            # the job's own checkpoints
    assert os.path.isdir(path) and path.startswith(str(root))


def test_assign_refuses_trainable_pieces(ps):
    shard, client, _ = ps
    before = client.pull()["hidden/weights"]
    with RpcClient(shard.endpoint) as rpc, pytest.raises(PermissionDeniedError) as caught:
        rpc.call(PsOps.Assign(["hidden/weights"]), tensors=[np.full_like(before, np.nan)], timeout=5)
    assert str(caught.value) == ("assign sets non-trainable variables only; 'hidden/weights' is trainable "
                                 "(its values change by pushed gradients, through the optimizer)")
    np.testing.assert_array_equal(client.pull()["hidden/weights"], before)


@pytest.mark.parametrize("policy", ["refuse", "skip"])
def test_assign_of_non_finite_values_goes_through_the_policy(policy, tmp_path):
    """A shard of non-trainable pieces only (BatchNorm's statistics are such), served for real in a thread."""
    from zmqflow.services.ps.server import PsService
    placement = place(model_variables(MNIST_MLP), 1)
    pieces = {p.key: p for p in placement.for_shard(0)}
    service = PsService("tcp://127.0.0.1:*", 0, pieces, {"optimizer": {"kind": "sgd", "learning_rate": 0.1},
                                                         "nonfinite": policy}, trainable=set())
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        client = PsClient([service.endpoint], placement)
        client.initialize(load_model(MNIST_MLP).initial_values(1))
        before = client.pull()["hidden/biases"]
        bad = np.full(100, np.inf, np.float32)
        with RpcClient(service.endpoint) as rpc:
            if policy == "refuse":
                with pytest.raises(InvalidArgumentError, match=r"^assigned value of 'hidden/biases' holds NaN or Inf: "
                                                               r"refused, the variables are unchanged"):
                    rpc.call(PsOps.Assign(["hidden/biases"]), tensors=[bad], timeout=5)
            else:
                assert rpc.call(PsOps.Assign(["hidden/biases"]), tensors=[bad], timeout=5)[0]["assigned"] == 0
            np.testing.assert_array_equal(client.pull()["hidden/biases"], before)
            good = np.ones(100, np.float32)                          # a finite one is assigned
            assert rpc.call(PsOps.Assign(["hidden/biases"]), tensors=[good], timeout=5)[0]["assigned"] == 1
            np.testing.assert_array_equal(client.pull()["hidden/biases"], good)
        client.close()
    finally:
        service.stop()
        thread.join(5)


def test_preload_is_capped_and_never_replaces_a_name(ps):
    shard, client, _ = ps
    with PsShardClient(shard.endpoint) as rpc:
        assert rpc.preload("small", {"x": np.arange(500, dtype=np.int32)})["rows"] == 500     # 2000 bytes
        with pytest.raises(AlreadyExistsError, match="^ps:0 already holds preloaded data 'small'; it is never "
                                                     "replaced"):
            rpc.preload("small", {"x": np.zeros(10, dtype=np.int32)})
        with pytest.raises(ResourceExhaustedError, match=r"^preloaded data 'big' of 2004 bytes: ps:0 holds 2000 "
                                                         r"and preloads at most 4000 bytes in all "
                                                         r"\(--max-preload-bytes\)$"):
            rpc.preload("big", {"x": np.zeros(501, dtype=np.int32)})
    assert client.take_rows_async("small", [0, 499]).result()["x"].tolist() == [0, 499]


# ------------------------------------------------ CURVE: roles per client key


@pytest.fixture(scope="module")
def role_keys(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("role-keys") / "keys")
    curve.generate(directory, ["member", "serving", "admin"])
    return directory


@pytest.fixture(scope="module")
def secure_broker(module_processes, role_keys):
    return module_processes.service("zmqflow.services.broker", ["--curve-dir", role_keys])


def as_key(name, monkeypatch, role_keys):
    monkeypatch.setenv(curve.ENV, role_keys)
    monkeypatch.setenv(curve.KEY_ENV, name)


def test_the_keys_record_their_roles(role_keys):
    roles = {name: curve.recorded_roles(os.path.join(role_keys, "authorized", f"{name}.key"))
             for name in ("client", "member", "serving", "admin")}
    assert roles == {"client": ("client", "member", "admin"), "member": ("member", "client"), "serving": ("client",),
                     "admin": ("client", "member", "admin")}


def test_the_gateway_key_is_served_on_client_ops_and_refused_on_member_and_admin_ops(secure_broker, role_keys,
                                                                                      monkeypatch):
    as_key("member", monkeypatch, role_keys)
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="secure", broker=secure_broker.endpoint)
    queue.enqueue_many([np.arange(4, dtype=np.int32)])
    as_key("serving", monkeypatch, role_keys)
    with RpcClient(secure_broker.endpoint) as gateway:
        assert gateway.call(BrokerOps.Size(queue.handle), timeout=5)[0]["size"] == 4
        for request, role in ((BrokerOps.Dequeue(queue.handle), "member"), (BrokerOps.Close(queue.handle), "member"),
                              (BrokerOps.Reset(""), "admin"), (BrokerOps.Shutdown(), "admin")):
            with pytest.raises(PermissionDeniedError) as caught:
                gateway.call(request, timeout=5)
            article = "an" if role == "admin" else "a"
            assert str(caught.value) == (f"{request.OP} on the queue-broker at {secure_broker.endpoint} is {article} "
                                         f"{role} op: the CURVE client key 'serving' is not granted the {role} role")
    as_key("member", monkeypatch, role_keys)
    with RpcClient(secure_broker.endpoint) as member:
        with pytest.raises(PermissionDeniedError, match="the CURVE client key 'member' is not granted the admin role"):
            member.call(BrokerOps.Reset(""), timeout=5)
    assert queue.size() == 4 and not queue.is_closed() and secure_broker.alive()
    np.testing.assert_array_equal(queue.dequeue_many(4), np.arange(4))


@pytest.fixture(scope="module")
def secure_ps(module_processes, role_keys):
    """A ps shard under CURVE with the deployments' role keys, not yet initialized (the chief's first act)."""
    return module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--curve-dir",
                                                            role_keys])


def test_each_deployment_key_does_what_its_component_needs_at_the_ps_and_no_more(secure_ps, role_keys, monkeypatch):
    """The keys compose and Kubernetes give their components (jobs/spec.py's curve_key): a gateway's `serving`
    reads stats only, a worker's `member` pulls and pushes but cannot initialize or stop the shard, the chief's
    `admin` does both."""
    placement = place(model_variables(MNIST_MLP), 1)
    values = load_model(MNIST_MLP).initial_values(1)

    def denied(key, role, op):
        return (f"{op} on the ps-shard at {secure_ps.endpoint} is {'an' if role == 'admin' else 'a'} {role} op: "
                f"the CURVE client key '{key}' is not granted the {role} role")

    for key in ("serving", "member"):
        as_key(key, monkeypatch, role_keys)
        client = PsClient([secure_ps.endpoint], placement)
        try:
            assert client.stats()[0]["version"] == 0                      # a client op: anyone's
            with pytest.raises(PermissionDeniedError) as caught:
                client.initialize(values)
            assert str(caught.value) == denied(key, "admin", "init")
            with pytest.raises(PermissionDeniedError) as caught:
                client.shutdown()
            assert str(caught.value) == denied(key, "admin", "shutdown")
            if key == "serving":
                with pytest.raises(PermissionDeniedError) as caught:
                    client.pull()
                assert str(caught.value) == denied(key, "member", "pull")
        finally:
            client.close()
    as_key("admin", monkeypatch, role_keys)
    chief = PsClient([secure_ps.endpoint], placement)
    chief.initialize(values)
    as_key("member", monkeypatch, role_keys)
    worker = PsClient([secure_ps.endpoint], placement)
    try:
        pulled = worker.pull()
        np.testing.assert_array_equal(pulled["hidden/biases"], values["hidden/biases"])
        grads = {name: np.ones_like(value) for name, value in pulled.items()}
        worker.push(grads)
        assert not np.array_equal(worker.pull()["hidden/biases"], values["hidden/biases"])   # the push applied
    finally:
        worker.close()
    assert secure_ps.alive()
    chief.shutdown()                                                   # the chief ends the job
    chief.close()
    wait_for(lambda: not secure_ps.alive(), 10, "the ps to exit on the chief's shutdown")
