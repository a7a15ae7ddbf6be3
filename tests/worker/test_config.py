"""WorkerConfig: flags -> one value, the task completed from TF_CONFIG as Kubeflow's TFJob sets it."""

import json

import pytest

from zmqflow.services.worker.config import UsageError, WorkerConfig

pytestmark = pytest.mark.unit

CLUSTER = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"]}


def tf_config(monkeypatch, task_type, index):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER, "task": {"type": task_type, "index": index}}))


def test_the_chief_job_comes_first_and_the_worker_job_follows(monkeypatch):
    tf_config(monkeypatch, "worker", 1)
    config = WorkerConfig.from_options(batch_size=50, unknown_flag="ignored")
    assert (config.task_index, config.num_workers, config.is_chief) == (2, 3, False)
    assert config.ps_endpoints == ["tcp://p0:1", "tcp://p1:1"]
    assert (config.job, config.task, config.name, config.batch_size) == ("worker", 1, "worker:2", 50)
    tf_config(monkeypatch, "chief", 0)
    chief = WorkerConfig.from_options()
    assert (chief.task_index, chief.is_chief, chief.job) == (0, True, "chief")


def test_flags_win_over_tf_config(monkeypatch):
    tf_config(monkeypatch, "worker", 0)
    config = WorkerConfig.from_options(ps_endpoints=("tcp://mine:1",), task_index=7, num_workers=9)
    assert (config.ps_endpoints, config.task_index, config.num_workers) == (("tcp://mine:1",), 7, 9)


def test_without_ps_shards_it_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(UsageError, match="no ps shards"):
        WorkerConfig.from_options()
    config = WorkerConfig.from_options(ps_endpoints=("tcp://p:1",))
    assert (config.task_index, config.num_workers, config.task, config.is_chief) == (0, 1, 0, True)


def test_the_tensorboard_directory():
    assert WorkerConfig(checkpoint_dir="/ck").tensorboard_dir == "/ck/train"
    assert WorkerConfig(checkpoint_dir="/ck", summary_dir="/tb").tensorboard_dir == "/tb"
    assert WorkerConfig(checkpoint_dir="/ck", summary_dir="off").tensorboard_dir is None
    assert WorkerConfig().tensorboard_dir is None
