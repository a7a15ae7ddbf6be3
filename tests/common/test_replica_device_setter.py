"""`zmqflow.replica_device_setter`: TensorFlow's device function over common/cluster/placement.py's rule, and the
placement a session's pushes and pulls honour (each variable is held by the ps task it was placed on)."""

import threading

import numpy as np
import pytest

import zmqflow
from tests.support.ports import free_port
from zmqflow.common.cluster.device import Op, current_device
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.cluster.placement import place
from zmqflow.common.wire.protocol import PsOps
from zmqflow.common.clients.ps import PsShardClient
from zmqflow.common.variables import VariableSpec
from zmqflow.inputs.datasets import mnist_split

VARIABLES = [VariableSpec("embedding", (1000, 16)), VariableSpec("bias", (16,)), VariableSpec("kernel", (16, 16)),
             VariableSpec("scale", ())]


@pytest.mark.unit
@pytest.mark.parametrize("strategy, shards", [("round_robin", [0, 1, 0, 1]), ("greedy", [0, 1, 1, 1])])
def test_the_device_function_places_variables_as_the_placement_does(strategy, shards):
    setter = zmqflow.replica_device_setter(ps_tasks=2, ps_strategy=strategy)
    assert [p.shard for p in setter.placement(VARIABLES)] == shards
    assert setter.placement(VARIABLES) == place(VARIABLES, 2, strategy)
    with zmqflow.device(setter):                       # as `with tf.device(replica_device_setter(...)):`
        devices = [current_device(v).to_string() for v in VARIABLES]
        assert current_device("matmul").to_string() == "/job:worker"   # not a variable: on the worker job (TF's)
    assert devices == [f"/job:ps/task:{s}" for s in shards]


def variable(name):
    return Op(name, "VariableV2")


@pytest.mark.unit
@pytest.mark.parametrize("worker_device, s, p1, p2", [
    # TensorFlow 1.15's answers (tf.train.replica_device_setter, device_setter.py), written literally
    ("/job:worker/task:0", "/job:worker/task:0", "/job:worker/task:0/device:GPU:1", "/job:worker/task:1/device:GPU:1"),
    (None, "/job:worker", "/job:worker/device:GPU:1", "/job:worker/task:1/device:GPU:1"),
])
def test_the_chapters_nested_block_is_placed_as_tensorflow_places_it(worker_device, s, p1, p2):
    """Hands-On ML ch. 12: v1..v3 round-robin on the ps tasks; s on the worker; p1 in /gpu:1; p2 in /gpu:1 then
    /task:1. Inner scopes win field by field; worker_device (default /job:worker) fills in the rest."""
    devices = {} if worker_device is None else {"worker_device": worker_device}
    with zmqflow.device(zmqflow.replica_device_setter(ps_tasks=2, ps_device="/job:ps", **devices)):
        placed = {name: str(current_device(variable(name))) for name in ("v1", "v2", "v3")}
        placed["s"] = str(current_device(Op("s", "AddV2")))
        with zmqflow.device("/gpu:1"):
            placed["p1"] = str(current_device(Op("p1", "Mul")))
            with zmqflow.device("/task:1"):
                placed["p2"] = str(current_device(Op("p2", "Mul")))
        with zmqflow.device("/task:1"):
            with zmqflow.device("/gpu:1"):
                placed["p3"] = str(current_device(Op("p3", "Mul")))
    assert placed == {"v1": "/job:ps/task:0", "v2": "/job:ps/task:1", "v3": "/job:ps/task:0", "s": s,
                      "p1": p1, "p2": p2, "p3": p2}


@pytest.mark.unit
def test_a_variable_keeps_the_fields_its_inner_scopes_set_as_in_tensorflow():
    setter = zmqflow.replica_device_setter(ps_tasks=2, worker_device="/job:worker/task:0")
    with zmqflow.device(setter):
        with zmqflow.device("/cpu:0"):      # TF: the ps device merged under the variable's own scope
            assert str(current_device(variable("a"))) == "/job:ps/task:0/device:CPU:0"
        with zmqflow.device("/job:local"):  # another job: no ps task is chosen (and none is used up)
            assert str(current_device(variable("b"))) == "/job:local"
        assert str(current_device(variable("c"))) == "/job:ps/task:1"
    keep = zmqflow.replica_device_setter(ps_tasks=2, merge_devices=False)
    with zmqflow.device(keep), zmqflow.device("/gpu:1"):
        assert str(current_device(Op("m", "MatMul"))) == "/device:GPU:1"   # kept as the inner scope set it
    no_ps = zmqflow.replica_device_setter(ps_tasks=2, ps_device="")
    with zmqflow.device(no_ps):
        assert str(current_device(variable("d"))) == "/job:worker"        # TF: no ps job, the worker's
    with pytest.raises(InvalidArgumentError, match="device string '/job:worker/gpu:x'"):
        zmqflow.replica_device_setter(ps_tasks=1, worker_device="/job:worker/gpu:x")


@pytest.mark.unit
def test_the_ps_tasks_come_from_the_cluster_and_bad_arguments_are_named():
    cluster = {"ps": ["h:1", "h:2", "h:3"], "worker": ["h:4"]}
    assert zmqflow.replica_device_setter(cluster=cluster).num_ps == 3
    with pytest.raises(InvalidArgumentError, match="the cluster has no ps job"):
        zmqflow.replica_device_setter(cluster={"worker": ["h:4"]})
    with pytest.raises(InvalidArgumentError, match="needs ps_tasks >= 1"):
        zmqflow.replica_device_setter()
    with pytest.raises(InvalidArgumentError, match="ps_strategy 'random' is not known"):
        zmqflow.replica_device_setter(ps_tasks=2, ps_strategy="random")
    with pytest.raises(InvalidArgumentError, match="places variables on 2 ps tasks; the cluster has 3"):
        zmqflow.Server(cluster, "worker", 0, device_setter=zmqflow.replica_device_setter(ps_tasks=2))


def shard_holds(endpoint):
    """The piece names a ps shard holds, as its pull answers them."""
    with PsShardClient(endpoint) as client:
        return set(client.rpc.call(PsOps.Pull(), timeout=5.0)[0]["names"])


@pytest.mark.service
def test_a_session_pushes_and_pulls_each_variable_on_the_shard_it_was_placed_on():
    cluster = zmqflow.ClusterSpec({"ps": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"],
                                   "worker": [f"127.0.0.1:{free_port()}"]})
    setter = zmqflow.replica_device_setter(cluster=cluster, ps_strategy="greedy")
    with zmqflow.device(setter):                       # every task opens the same scope around its Server
        ps = [zmqflow.Server(cluster, "ps", i, model="mlp") for i in range(2)]
        worker = zmqflow.Server(cluster, "worker", 0, model="mlp")
    threads = [threading.Thread(target=server.join, daemon=True) for server in ps]
    for thread in threads:
        thread.start()
    try:
        (x, y), _ = mnist_split()
        with zmqflow.MonitoredTrainingSession(worker, hooks=[zmqflow.StopAtStepHook(last_step=5)]) as sess:
            while not sess.should_stop():
                sess.run(x[:50], y[:50])
            holds = [shard_holds(server.ps_endpoints[i]) for i, server in enumerate(ps)]
            params = sess.ps.pull()
        assert holds == [{"hidden/weights"}, {"hidden/biases", "softmax/weights", "softmax/biases"}]  # by bytes
        assert sess.global_step >= 5 and np.isfinite(params["hidden/weights"]).all()
    finally:
        for server in ps:
            server.service.stop()
        for thread in threads:
            thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)     # the chief shut both shards down
