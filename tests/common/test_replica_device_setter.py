"""`zmqflow.replica_device_setter`: TensorFlow's device function over common/cluster/placement.py's rule, and the
placement a session's pushes and pulls honour (each variable is held by the ps task it was placed on)."""

import threading

import numpy as np
import pytest

import zmqflow
from tests.support.ports import free_port
from zmqflow.common.cluster.device import current_device
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
        assert current_device("matmul").to_string() == ""          # not a variable: stays on the worker
    assert devices == [f"/job:ps/task:{s}" for s in shards]


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
