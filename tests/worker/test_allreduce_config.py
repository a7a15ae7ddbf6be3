"""--mode allreduce's settings: a job of no ps shards (num_ps need not say so), a worker told where the chief's ring
is (by --chief or TF_CONFIG), and clear usage errors for what cannot be (a ps, spares, input held on a ps)."""

import json

import pytest
from click.testing import CliRunner

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.spec import Placement, job_spec, tasks
from zmqflow.services.worker.cli import command as worker_command
from zmqflow.services.worker.config import UsageError, WorkerConfig

pytestmark = pytest.mark.unit


def test_an_allreduce_job_has_no_ps_and_its_workers_reduce_among_themselves():
    spec = job_spec(mode="allreduce", num_workers=3, lost_policy="abort")
    assert spec.cluster.ps == 0
    planned = tasks(spec, Placement("tcp://127.0.0.1:5555", log_dir="/tmp/x", train_rows=100))
    assert [t.role for t in planned] == ["worker"] * 3     # input from the launcher's feeder, no ps, no reader
    options = planned[0].options
    assert options["mode"] == "allreduce" and options["lost-policy"] == "abort" and options["ps"] == []
    assert json.loads(options["optimizer"]) == spec.training.optimizer and not options["shutdown-ps"]
    assert options["bind"] == "tcp://127.0.0.1:*"


@pytest.mark.parametrize("options, named", [({"num_ps": 1}, "num_ps 1"), ({"spare_replicas": 1}, "spare_replicas 1"),
                                            ({"input": "ps"}, "input 'ps'"), ({"lost_policy": "retry"}, "lost_policy")])
def test_what_an_allreduce_job_cannot_have_is_named(options, named):
    with pytest.raises(InvalidArgumentError, match=named):
        job_spec(mode="allreduce", **options)


def test_a_worker_needs_the_chiefs_ring_and_no_ps(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(UsageError, match="--chief"):
        WorkerConfig.from_options(mode="allreduce", task_index=1, num_workers=2)
    with pytest.raises(UsageError, match="drop --ps"):
        WorkerConfig.from_options(mode="allreduce", ps_endpoints=("tcp://p:1",))
    assert WorkerConfig.from_options(mode="allreduce").is_chief        # the chief needs neither


def test_tf_config_gives_the_chiefs_ring_and_each_task_its_own_address(monkeypatch):
    cluster = {"worker": ["w0:5610", "w1:5611"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    config = WorkerConfig.from_options(mode="allreduce")
    assert (config.chief, config.bind, config.task_index, config.num_workers) == ("tcp://w0:5610", "tcp://*:5611", 1, 2)


def test_the_worker_command_exits_2_naming_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    result = CliRunner().invoke(worker_command, ["--mode", "allreduce", "--task-index", "1", "--num-workers", "2"])
    assert result.exit_code == 2 and "--chief" in result.output


def test_zmqflow_train_refuses_a_ps_for_allreduce_with_exit_2():
    from zmqflow.cli.train import command as train_command
    result = CliRunner().invoke(train_command, ["--mode", "allreduce", "--num-ps", "1", "--epochs", "1"])
    assert result.exit_code == 2 and "mode allreduce runs without ps shards" in result.output
    assert "got num_ps 1" in result.output
