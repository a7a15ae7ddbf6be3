"""How a worker finds its place in a pipelined job from its flags: its stage and copy of the pipeline
(--task-index, --num-workers) and the stages it sends to (--pipeline-next [STAGE=]ENDPOINT); a wrong
flag is a usage error (exit 2) naming it."""

import json
import os
import subprocess
import sys

import pytest

from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Add, Dense, Input
from zmqflow.models.network import Network, Sequential
from zmqflow.services.worker.build import PipelineTask, pipeline_task
from zmqflow.services.worker.config import UsageError, WorkerConfig

pytestmark = pytest.mark.unit

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def branching():
    """Stage 0 feeds stages 1 and 2, which stage 3 adds."""
    x = Input((3,), name="x")
    trunk = Dense(4, device="/job:worker/task:0")(x)
    joined = Add(device="/job:worker/task:3")([Dense(4, device="/job:worker/task:1")(trunk),
                                               Dense(4, device="/job:worker/task:2")(trunk)])
    return LayerModel(Network(x, Dense(2)(joined)))


def place(task_index, num_workers, *pipeline_next, model=branching):
    return pipeline_task(WorkerConfig(ps_endpoints=("tcp://127.0.0.1:1",), task_index=task_index,
                                      num_workers=num_workers, pipeline_next=pipeline_next), model())


def test_each_worker_finds_its_stage_its_copy_and_the_stages_it_sends_to():
    chief = place(0, 4, "1=tcp://a:1", "2=tcp://a:2")
    assert (chief.stage, chief.replica, chief.replicas, chief.downstream) == (0, 0, 1, {1: "tcp://a:1", 2: "tcp://a:2"})
    second = place(5, 8, "3=tcp://b:3")                           # workers 4..7 are the second copy
    assert (second.stage, second.replica, second.replicas, second.downstream) == (1, 1, 2, {3: "tcp://b:3"})
    assert place(3, 4).downstream == {}                           # the output stage sends nowhere
    chain = lambda: LayerModel(Sequential([Dense(4), Dense(2, device="/job:worker/task:1")], input_shape=(3,)))
    assert place(0, 2, "tcp://c:1", model=chain).downstream == {1: "tcp://c:1"}   # a plain ENDPOINT: the next stage
    assert place(0, 1, model=lambda: LayerModel(Sequential([Dense(2)], input_shape=(3,)))) is None
    assert isinstance(chief, PipelineTask)


@pytest.mark.parametrize("task, workers, links, message", [
    (0, 6, (), "run on 4 workers .* the job has 6 .* it must be 4, or a multiple of it"),
    (0, 4, ("tcp://a:1",), r"--pipeline-next tcp://a:1: stage 0 sends to stages \[1, 2\]; give each as STAGE=ENDPOINT"),
    (0, 4, ("1=tcp://a:1",), "worker 0 runs pipeline stage 0 of 4: pass --pipeline-next for stage 2"),
    (1, 4, ("2=tcp://a:2",), r"--pipeline-next 2=tcp://a:2: stage 1 does not send to stage 2 \(it sends to \[3\]\)"),
    (3, 4, ("1=tcp://a:1",), "stage 3 does not send to stage 1 .*none: it is the output stage"),
])
def test_a_wrong_pipeline_flag_names_itself(task, workers, links, message):
    with pytest.raises(UsageError, match=message):
        place(task, workers, *links)


@pytest.mark.service
def test_the_worker_command_exits_2_on_a_wrong_pipeline_flag():
    model = json.dumps({"type": f"{EXAMPLES}/branching_model.py:build", "width": 8, "branch": 4})
    done = subprocess.run([sys.executable, "-m", "zmqflow.services.worker", "--ps", "tcp://127.0.0.1:1", "--model",
                           model, "--num-workers", "4", "--pipeline-next", "tcp://127.0.0.1:2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "stage 0 sends to stages [1, 2]; give each as STAGE=ENDPOINT" in done.stderr
