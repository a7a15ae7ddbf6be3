"""TF_CONFIG, as Kubeflow's TFJob sets it: `zmqflow.Server.from_tf_config()` makes each process the task it
names (a chief job included), the seeds' script falls back to it without flags, and a malformed one is
refused naming what is wrong."""

import json
import os
import subprocess
import sys

import pytest

import zmqflow
from tests.support.ports import free_port
from tests.support.processes import alive
from zmqflow.common.errors import InvalidArgumentError

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "distributed_mnist.py")


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@pytest.mark.integration
def test_the_script_runs_each_task_from_tf_config_alone(tmp_path):
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "chief": [f"127.0.0.1:{free_port()}"],
               "worker": [f"127.0.0.1:{free_port()}"]}
    procs = []
    try:
        for task_type in ("ps", "worker", "chief"):
            env = {**os.environ, "TF_CONFIG": tf_config(cluster, task_type, 0)}
            procs.append(subprocess.Popen([sys.executable, SCRIPT, "--train_steps", "400"], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=open(tmp_path / f"{task_type}.log", "w")))
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    logs = {name: (tmp_path / f"{name}.log").read_text()[-2000:] for name in ("ps", "worker", "chief")}
    assert [p.returncode for p in procs] == [0, 0, 0], logs
    line = [row for row in outputs[2].splitlines() if row.startswith("distributed_mnist:")][0]   # the chief's
    accuracy, step = float(line.split()[3]), int(line.split()[-1])
    assert accuracy > 0.85 and 400 <= step <= 410
    assert not [p.pid for p in procs if alive(p.pid)]


@pytest.mark.unit
def test_a_server_from_tf_config_is_the_task_it_names():
    cluster = {"ps": ["127.0.0.1:2222", "127.0.0.1:2223"], "chief": ["127.0.0.1:2224"],
               "worker": ["127.0.0.1:2225", "127.0.0.1:2226"]}
    worker = zmqflow.Server.from_tf_config(env={"TF_CONFIG": tf_config(cluster, "worker", 1)})
    assert (worker.job_name, worker.task_index, worker.replica, worker.is_chief) == ("worker", 1, 2, False)
    assert worker.num_workers == 3 and worker.ps_endpoints == ["tcp://127.0.0.1:2222", "tcp://127.0.0.1:2223"]
    chief = zmqflow.Server.from_tf_config(env={"TF_CONFIG": tf_config(cluster, "chief", 0)})
    assert chief.replica == 0 and chief.is_chief


@pytest.mark.unit
@pytest.mark.parametrize("value, message", [
    ("", "TF_CONFIG is not set"),
    ("{}", "TF_CONFIG is not set"),
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}}', "no task type"),
    ('{"cluster": {"ps": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG: task type 'worker' \\(index 0\\) is not a job of the cluster"),
    ('{"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, "task": {"type": "worker", "index": 5}}',
     "task 'worker' index 5 is not in the cluster"),
    ('{"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, "task": {"type": "worker", "index": -1}}',
     "task index -1 is not a non-negative integer"),
    ('{"cluster": {"worker": ["127.0.0.1:2223"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG: the cluster needs a ps job and a worker job"),
    ('{"cluster": {"ps": ["127.0.0.1"], "worker": ["127.0.0.1:2223"]}, "task": {"type": "worker"}}',
     "TF_CONFIG: invalid cluster spec:\n  job 'ps' task 0 address '127.0.0.1' has no port"),
    ('{"cluster": {"ps": ["h:1"], "evaluator": ["h:2"], "worker": ["h:3"]}, "task": {"type": "evaluator"}}',
     "job 'evaluator' has no part in training"),
])
def test_a_malformed_tf_config_is_refused_naming_what_is_wrong(value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        zmqflow.Server.from_tf_config(env={"TF_CONFIG": value})


@pytest.mark.integration
def test_the_script_says_what_is_wrong_with_its_tf_config():
    env = {**os.environ, "TF_CONFIG": '{"cluster": {"ps": ["127.0.0.1:2222"]}, "task": {"type": "worker"}}'}
    done = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().endswith("distributed_mnist: TF_CONFIG: task type 'worker' (index 0) is not a job of "
                                        "the cluster (jobs: ps)"), done.stderr
