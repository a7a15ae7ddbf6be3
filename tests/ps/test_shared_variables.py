"""Shared variables in resource containers on real ps processes (issue 25, item 3): the seeds'
simple_client.py across processes, reset, checkpoints, and every refusal with TensorFlow's error class."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import zmqflow
from click.testing import CliRunner
from zmqflow.cli.main import main
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.cluster.placement import place, shared_variable_shard
from zmqflow.common.errors import (InvalidArgumentError, NotFoundError, PermissionDeniedError,
                                   ResourceExhaustedError, UnauthenticatedError)
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.variables import IndexedSlices
from zmqflow.common.wire.protocol import PsOps
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP
from tests.security.test_roles import missing, refused
from tests.support import wait_for

pytestmark = pytest.mark.service

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                       "shared_variables.py")
MODEL = json.dumps(MNIST_MLP)


def ps_args(root, *extra):
    return ["--model", MODEL, "--checkpoint-root", str(root), *extra]


@pytest.fixture(scope="module")
def ps(module_processes, tmp_path_factory):
    """One ps task, its shared variables bounded to 8000 bytes."""
    return module_processes.service("zmqflow.services.ps", ps_args(tmp_path_factory.mktemp("root"),
                                                                   "--max-shared-variable-bytes", "8000"))


def call(endpoint, request, tensors=()):
    with RpcClient(endpoint) as client:
        return client.call(request, tensors=tensors, timeout=5)


def test_one_client_initialises_two_other_processes_increment_and_reset_frees_it(ps):
    """simple_client.py: client A (this process) creates var = 0.0 in container experiment0, two clients
    (processes of the example, at once) add 1.0 25 times each, A reads the sum; reset frees the variable."""
    sess = zmqflow.Session(ps.endpoint)
    with zmqflow.container("experiment0"):
        var = sess.variable("var", initial_value=0.0)
    assert (var.container, var.name, var.dtype, var.shape) == ("experiment0", "var", np.float32, ())
    clients = [subprocess.Popen([sys.executable, EXAMPLE, "--client", "increment", "--ps_hosts", ps.endpoint,
                                 "--times", "25"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for _ in range(2)]
    try:
        outputs = [c.communicate(timeout=60)[0] for c in clients]
    finally:
        for c in clients:
            c.kill()
    assert [c.returncode for c in clients] == [0, 0], outputs
    assert var.read_value() == 50.0 and var.read_value().dtype == np.float32
    with zmqflow.container("experiment0"):        # create-if-absent: a second initialiser keeps the value
        assert sess.variable("var", initial_value=0.0).read_value() == 50.0
    assert zmqflow.reset(ps.endpoint, ["experiment0"]) == {"experiment0": 1}
    with pytest.raises(NotFoundError, match=re.escape("no shared variable 'var' in container 'experiment0' on this "
                                                      "ps (it holds none there)")):
        var.read_value()


def test_assign_assign_add_and_scatter_add_as_tensorflow(ps):
    sess = zmqflow.Session(ps.endpoint)
    counter = sess.variable("ops/counter", initial_value=0)          # a Python int: int32, as tf.Variable(0)
    assert counter.dtype == np.int32
    assert counter.assign_add(5) == 5 and counter.assign(3) == 3 and counter.assign_add(2, read_value=False) is None
    assert counter.read_value() == 5
    table = sess.variable("ops/table", initial_value=np.zeros((4, 2), np.float64))
    after = table.scatter_add([1, 3, 1], np.ones((3, 2)))            # a row named twice gets both
    np.testing.assert_array_equal(after, [[0, 0], [2, 2], [0, 0], [1, 1]])
    table.scatter_add(IndexedSlices(np.array([0]), np.full((1, 2), 0.5)), read_value=False)   # TF's sparse_delta
    np.testing.assert_array_equal(table.read_value()[0], [0.5, 0.5])
    assert {(v["name"], v["dtype"], tuple(v["shape"])) for v in sess.list_variables("")} >= {
        ("ops/counter", "int32", ()), ("ops/table", "float64", (4, 2))}


def test_reading_a_missing_variable_is_not_found(ps):
    with pytest.raises(NotFoundError) as caught:
        call(ps.endpoint, PsOps.ReadVariable("never-made", "c"))
    assert str(caught.value) == ("no shared variable 'never-made' in container 'c' on this ps (it holds none "
                                 "there): create it first, with an initial value; a reset of its container frees it")
    with pytest.raises(NotFoundError):
        zmqflow.Session(ps.endpoint).variable("never-made")          # no initial value: it must exist


def test_a_value_of_another_dtype_is_invalid_argument(ps):
    sess = zmqflow.Session(ps.endpoint)
    sess.variable("dtype/n", initial_value=np.int64(7))
    with pytest.raises(InvalidArgumentError) as caught:              # the ps checks what arrives
        call(ps.endpoint, PsOps.AssignAddVariable("dtype/n"), [np.array(1.0, np.float32)])
    assert str(caught.value) == ("assign_add of shared variable 'dtype/n' in the default container: expected "
                                 "int64 [], got float32 []")
    with pytest.raises(InvalidArgumentError, match=re.escape("shared variable 'dtype/n' in the default container "
                                                             "exists as int64 []; it cannot be created again as "
                                                             "float32 []")):
        sess.variable("dtype/n", initial_value=0.0)
    with pytest.raises(InvalidArgumentError, match="1.5 is no int64 value \\(it has a fraction\\)"):
        sess.variable("dtype/n").assign_add(1.5)                      # the client: no silent truncation
    sess.variable("dtype/flag", initial_value=True)
    with pytest.raises(InvalidArgumentError, match="assign_add adds numbers; shared variable 'dtype/flag' in the "
                                                   "default container is bool"):
        call(ps.endpoint, PsOps.AssignAddVariable("dtype/flag"), [np.array(True)])
    with pytest.raises(InvalidArgumentError, match="a value of a numeric dtype"):
        call(ps.endpoint, PsOps.CreateVariable("dtype/s"), [np.array([b"a"], dtype=object)])
    assert sess.variable("dtype/n").read_value() == 7


def test_a_value_of_another_shape_is_invalid_argument(ps):
    sess = zmqflow.Session(ps.endpoint)
    sess.variable("shape/v", initial_value=np.zeros(3, np.float32))
    with pytest.raises(InvalidArgumentError) as caught:
        call(ps.endpoint, PsOps.AssignVariable("shape/v"), [np.zeros(4, np.float32)])
    assert str(caught.value) == ("assign of shared variable 'shape/v' in the default container: expected "
                                 "float32 [3], got float32 [4]")
    with pytest.raises(InvalidArgumentError, match=re.escape("create_variable takes 1 tensor (the initial value), "
                                                             "got 2")):
        call(ps.endpoint, PsOps.CreateVariable("shape/w"), [np.zeros(1), np.zeros(1)])
    np.testing.assert_array_equal(sess.variable("shape/v").read_value(), np.zeros(3))


def test_a_scatter_index_out_of_range_is_invalid_argument(ps):
    table = zmqflow.Session(ps.endpoint).variable("scatter/t", initial_value=np.zeros((3, 2), np.float32))
    with pytest.raises(InvalidArgumentError) as caught:
        call(ps.endpoint, PsOps.ScatterAddVariable("scatter/t"), [np.array([0, 3]), np.ones((2, 2), np.float32)])
    assert str(caught.value) == ("scatter_add of shared variable 'scatter/t' in the default container: "
                                 "indices[...] = 3 is not in [0, 3)")
    with pytest.raises(InvalidArgumentError, match=re.escape("updates must be float32 [2, 2] (the indices' shape, "
                                                             "then the variable's row shape), got float32 [2, 3]")):
        call(ps.endpoint, PsOps.ScatterAddVariable("scatter/t"), [np.array([0, 1]), np.ones((2, 3), np.float32)])
    with pytest.raises(InvalidArgumentError, match="indices must be int32 or int64, got float32"):
        call(ps.endpoint, PsOps.ScatterAddVariable("scatter/t"), [np.zeros(2, np.float32), np.ones((2, 2), np.float32)])
    np.testing.assert_array_equal(table.read_value(), np.zeros((3, 2)))   # nothing half-applied


def test_without_the_job_token_every_variable_op_is_refused_and_reset_needs_the_admin_token(ps):
    zmqflow.Session(ps.endpoint).variable("guarded", initial_value=1)
    for op, tensors in ((PsOps.CreateVariable("guarded"), [np.array(9, np.int32)]),
                        (PsOps.ReadVariable("guarded"), ()),
                        (PsOps.AssignVariable("guarded"), [np.array(9, np.int32)]),
                        (PsOps.AssignAddVariable("guarded"), [np.array(9, np.int32)]),
                        (PsOps.ScatterAddVariable("guarded"), [np.array([0]), np.array([9], np.int32)]),
                        (PsOps.ListVariables(), ())):
        assert refused(ps.endpoint, op.OP, op.encode(), tensors) == [
            missing(op.OP, "ps-shard", ps.endpoint), f"{op.OP} on the ps-shard at {ps.endpoint}: wrong job token"]
    for token, error in ((None, UnauthenticatedError), ("not-the-token", PermissionDeniedError)):
        with RpcClient(ps.endpoint, admin_token=token) as client, pytest.raises(error):
            client.call(PsOps.Reset(""), timeout=5)
    assert zmqflow.Session(ps.endpoint).variable("guarded").read_value() == 1


def test_the_shards_budget_bounds_shared_variables(ps):
    sess = zmqflow.Session(ps.endpoint)
    with zmqflow.container("budget"):
        with pytest.raises(ResourceExhaustedError, match=re.escape("holds at most 8000 bytes of shared variables in "
                                                                   "all (--max-shared-variable-bytes)")):
            sess.variable("big", initial_value=np.zeros(2000, np.float32))
        many = 0
        with pytest.raises(ResourceExhaustedError):                  # empty ones count too
            for many in range(100):
                sess.variable(f"empty{many}", initial_value=np.zeros(0, np.float32))
        assert 0 < many < 30                                          # 268 bytes each at least
    assert zmqflow.reset(ps.endpoint, "budget") == {"budget": many}
    with zmqflow.container("budget"):
        sess.variable("after", initial_value=np.zeros(100, np.float32))   # the freed bytes are back


def test_reset_frees_its_container_only_never_the_model(ps, tmp_path):
    client = PsClient([ps.endpoint], place(model_variables(MNIST_MLP), 1))
    client.initialize(load_model(MNIST_MLP).initial_values(1))
    before = client.pull()
    sess = zmqflow.Session(ps.endpoint)
    with zmqflow.container("a"):
        sess.variable("x", initial_value=1.0)
    with zmqflow.container("b"):
        sess.variable("x", initial_value=2.0)
    assert zmqflow.Session.reset(ps.endpoint, ["a"]) == {"a": 1}
    assert sess.variable("x", container="b").read_value() == 2.0
    with pytest.raises(NotFoundError):
        sess.variable("x", container="a")
    freed = zmqflow.reset(ps.endpoint)                               # None: every container holding one
    assert freed["b"] == 1 and "a" not in freed and sess.list_variables() == []
    assert client.stats()[0]["shared_variables"] == client.stats()[0]["shared_variable_bytes"] == 0
    for name, value in client.pull().items():                        # the model's variables stay
        np.testing.assert_array_equal(value, before[name])
    client.close()


@pytest.fixture(scope="module")
def two_shards(module_processes, tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    return root, [module_processes.service("zmqflow.services.ps", ps_args(root, "--num-ps", "2", "--task-index",
                                                                          str(i))) for i in range(2)]


def test_a_variable_asked_of_the_wrong_shard_is_refused(two_shards):
    """A client counting one ps task where the job has two would create a second copy: the shard refuses."""
    _, shards = two_shards
    name = next(f"v{i}" for i in range(100) if shared_variable_shard("", f"v{i}", 2) == 1)
    with pytest.raises(InvalidArgumentError, match=re.escape(f"shared variable {name!r} in the default container "
                                                             "lives on ps:1 of 2, not on ps:0")):
        zmqflow.Session(shards[0].endpoint).variable(name, initial_value=0)
    both = zmqflow.Session([s.endpoint for s in shards])
    assert both.variable(name, initial_value=4).read_value() == 4


def test_a_ps_restored_from_a_checkpoint_has_its_shared_variables(two_shards, processes):
    """Saved by two shards, restored onto one (--restore-from): each variable is back, wherever it lives now."""
    root, shards = two_shards
    endpoints = [s.endpoint for s in shards]
    names = [next(f"n{i}" for i in range(100) if shared_variable_shard("kept", f"n{i}", 2) == shard)
             for shard in (0, 1)]
    sess = zmqflow.Session(endpoints)
    with zmqflow.container("kept"):
        for k, name in enumerate(names):
            sess.variable(name, initial_value=np.arange(3, dtype=np.int64) * (k + 1)).assign_add(np.ones(3, np.int64))
    client = PsClient(endpoints, place(model_variables(MNIST_MLP), 2))
    client.initialize(load_model(MNIST_MLP).initial_values(1))
    path = client.save(str(root / "ckpt"))
    client.close()
    restored = processes.service("zmqflow.services.ps", ps_args(root, "--restore-from", str(root / "ckpt")))
    with zmqflow.container("kept"):
        values = [zmqflow.Session(restored.endpoint).variable(name).read_value() for name in names]
    np.testing.assert_array_equal(values, [[1, 2, 3], [1, 3, 5]])
    assert values[0].dtype == np.int64
    shown = CliRunner().invoke(main, ["checkpoint", "inspect", path])          # listed by container and name
    lines = shown.output.splitlines()
    table = lines[lines.index(next(l for l in lines if l.startswith("shared variable"))) + 1:]
    assert shown.exit_code == 0 and [
        line.split()[:4] for line in table if "'kept'" in line] == [[n, "'kept'", "[3]", "int64"]
                                                                    for n in sorted(names)], shown.output


def test_a_queue_made_in_a_container_scope_is_reset_with_its_shared_variables(ps, broker):
    """tf.container scopes queues too: one reset frees the container's variables on the ps and its queues."""
    from zmqflow.common.clients.queues import FIFOQueue
    with zmqflow.container("together"):
        queue = FIFOQueue(4, ["int32"], shapes=[[]], shared_name="q", broker=broker)
        zmqflow.Session(ps.endpoint).variable("v", initial_value=1)
    assert queue.size() == 0
    assert zmqflow.reset(ps.endpoint, ["together"], broker=broker) == {"together": 2}
    with pytest.raises(NotFoundError):
        queue.size()


@pytest.mark.unit
def test_container_scopes_nest_and_stay_in_their_thread():
    import threading
    from zmqflow.common.clients.containers import current_container
    seen = []
    with zmqflow.container("outer"):
        with zmqflow.container("inner"):
            threading.Thread(target=lambda: seen.append(current_container())).start()
            assert current_container() == "inner"
        assert current_container() == "outer"
    assert current_container() == "" and wait_for(lambda: seen == [""], timeout=5)
    with pytest.raises(InvalidArgumentError, match="container must be a string"):
        with zmqflow.container(None):
            pass


@pytest.mark.unit
def test_a_sessions_target_names_the_ps_tasks():
    from zmqflow.jobs.session import ps_endpoints
    cluster = {"ps": ["127.0.0.1:2222", "127.0.0.1:2223"], "worker": ["127.0.0.1:2224"]}
    both = ["tcp://127.0.0.1:2222", "tcp://127.0.0.1:2223"]
    assert ps_endpoints(cluster) == ps_endpoints(zmqflow.ClusterSpec(cluster)) == both
    assert ps_endpoints(zmqflow.Server(cluster, "worker", 0)) == both
    assert ps_endpoints("grpc://127.0.0.1:2222") == ps_endpoints("127.0.0.1:2222") == both[:1]   # TF's target
    assert ps_endpoints(["127.0.0.1:2222", "tcp://127.0.0.1:2223"]) == both
    with pytest.raises(InvalidArgumentError, match="the session's cluster has no ps job"):
        ps_endpoints({"worker": ["127.0.0.1:2224"]})
    with pytest.raises(InvalidArgumentError, match="a session's target is a ps address"):
        ps_endpoints(42)


@pytest.mark.unit
def test_the_shard_of_a_name_is_the_same_in_every_process_and_names_spread():
    names = [f"counter{i}" for i in range(1000)]
    here = [shared_variable_shard("c", n, 4) for n in names]
    code = ("from zmqflow.common.cluster.placement import shared_variable_shard as s; "
            "print([s('c', f'counter{i}', 4) for i in range(1000)])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": "123"})
    assert there.stdout.strip() == str(here), there.stderr        # not Python's hash(): salted per process
    assert all(200 < here.count(shard) < 300 for shard in range(4))
