"""Models other than the built-in MLP, trained by `zmqflow train` on real ps shards and workers."""

import hashlib
import json
import re
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support.waiting import wait_for
from zmqflow.common.cluster.placement import place
from zmqflow.common.clients.ps import PsClient, PsShardClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.registry import load_model, model_variables

pytestmark = pytest.mark.integration

USER_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense, Dropout
from zmqflow.models.network import Sequential


def build(input_signature, hidden=16, dropout=0.0):
    (shape, dtype), = input_signature.values()
    layers = [Dense(hidden, activation="relu")] + ([Dropout(dropout)] if dropout else []) + [Dense(10)]
    return LayerModel(Sequential(layers, input_shape=shape), seed=1)
'''


def train(*args, timeout=180):
    done = subprocess.run([sys.executable, "-m", "zmqflow", "train", "--json", *args], capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout, done.stderr




def test_a_model_from_the_users_own_file_with_options(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    code, out, err = train("--model", f"{path}:build", "--model-opt", "hidden=32", "--model-opt", "dropout=0.1",
                           "--epochs", "3")
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["test_accuracy"] > 0.6


@pytest.mark.parametrize("source, option, message", [
    ("import nothing_here\n", None, "failed to import: ModuleNotFoundError"),
    ("def build():\n    return None\n", None, "cannot be called as build(input_signature"),
    (USER_MODEL, "width=3", "unexpected keyword argument 'width'"),
    ("def other(sig):\n    pass\n", None, "has no function 'build'"),
    ("def build(sig):\n    return 42\n", None, "returned int, which lacks the model protocol"),
])
def test_a_bad_model_file_is_named_before_anything_starts(tmp_path, source, option, message):
    path = tmp_path / "bad_model.py"
    path.write_text(source)
    args = ["--model", f"{path}:build"] + (["--model-opt", option] if option else [])
    code, out, err = train(*args, timeout=60)
    assert code == 2 and "bad_model.py" in err and message in err, err
    code, _, err = train("--model", str(tmp_path / "missing.py:build"), timeout=60)
    assert code == 2 and "does not exist" in err


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
JAX_MODEL = os.path.join(EXAMPLES, "jax_model.py")   # the example a user runs is the model the tests train


MODELS = {"mlp": ([], 3),
          "cnn": (["--model", "cnn", "--model-opt", "filters=[16,32]", "--model-opt", "dense=128",
                   "--learning-rate", "0.002", "--backend", "numpy"], 5),
          "jax": (["--model", f"{JAX_MODEL}:build"], 5)}
"""name: (train options, epochs). Each is trained once per module, with a checkpoint, by `trained`."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained(name) -> (summary, checkpoint dir): `zmqflow train` of MODELS[name], run on first use only."""
    runs = {}

    def get(name):
        if name not in runs:
            if name == "jax":
                pytest.importorskip("jax", reason="JAX is not installed (pip install 'zmqflow[jax]')")
            options, epochs = MODELS[name]
            directory = tmp_path_factory.mktemp("trained") / name   # its name is the run id an ensemble shows
            code, out, err = train(*options, "--epochs", str(epochs), "--checkpoint-dir", str(directory))
            assert code == 0, err[-3000:]
            runs[name] = (json.loads(out.strip().splitlines()[-1]), directory)
        return runs[name]
    return get


@pytest.mark.slow
def test_a_small_cnn_beats_the_mlp_on_the_mnist_sample(trained):
    summary, _ = trained("cnn")
    assert summary["worker_exit_codes"] == [0, 0]
    assert summary["test_accuracy"] >= 0.93, summary     # 0.952 in 5 epochs, 0.956-0.968 in 8; the MLP: about 0.92


def test_a_jax_model_trains_on_the_cluster(trained):
    summary, _ = trained("jax")
    assert summary["worker_exit_codes"] == [0, 0] and summary["test_accuracy"] > 0.75, summary   # ~0.9 when quiet


@pytest.mark.slow
def test_one_ensemble_of_an_mlp_a_cnn_and_a_jax_model_served_from_their_checkpoints(tmp_path, processes, trained):
    """Each checkpoint records its model, so `serve --checkpoint` rebuilds it with no --model (the JAX model's
    file, code, with --trust-checkpoint-code); the aggregator averages three different models."""
    import numpy as np

    from zmqflow.common.clients.aggregator import AggregatorClient
    from zmqflow.common.clients.serve import ModelClient
    from zmqflow.inputs.datasets import mnist_split
    checkpoints = {name: trained(name)[1] for name in MODELS}
    servers = [processes.service("zmqflow.services.serve", ["--checkpoint", str(directory), "--backend", "numpy",
                                                           "--trust-checkpoint-code"])
               for directory in checkpoints.values()]
    kinds = []
    for server in servers:
        with ModelClient(server.endpoint) as client:
            kinds.append(client.model_info()["spec"]["type"])
    assert kinds[0] == "mlp" and kinds[1] == "cnn" and kinds[2].endswith("jax_model.py:build")
    aggregator = processes.service("zmqflow.services.aggregator", [a for s in servers for a in ("--member", s.endpoint)])
    _, (x, y) = mnist_split()
    with AggregatorClient(aggregator.endpoint) as client:
        probabilities, info = client.predict(x[:200], deadline_ms=5000, min_members=3)
    assert len(info["answered"]) == 3, info
    assert np.mean(np.argmax(probabilities, axis=1) == y[:200]) > 0.8
    done = subprocess.run([sys.executable, "-m", "zmqflow", "ensemble", "--json", "--log-dir", str(tmp_path / "logs"),
                           "--trust-checkpoint-code",
                           *[a for directory in checkpoints.values() for a in ("--checkpoint", str(directory))]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [m["run_id"] for m in report["members"]] == ["mlp", "cnn", "jax"]
    assert [m["model"] for m in report["members"]][:2] == ["mlp", "cnn"]
    assert report["ensemble"]["mean"] > 0.75     # MLP 3, CNN 5 and JAX 5 epochs on the 500 test rows


BATCH_NORM_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import BatchNorm, Dense
from zmqflow.models.network import Sequential


def build(input_signature):
    (shape, _), = input_signature.values()
    return LayerModel(Sequential([Dense(32), BatchNorm(momentum=0.9), Dense(10)], input_shape=shape), seed=0)
'''


def test_batch_norm_moving_statistics_live_on_the_ps_and_are_served(tmp_path, processes):
    """Workers assign the moving mean and variance to the ps each step; the checkpoint holds them and
    the model server predicts with them, as local inference on the checkpoint does."""
    import numpy as np

    from zmqflow.common.checkpoints.checkpoint import Checkpoint, latest_checkpoint
    from zmqflow.common.clients.serve import ModelClient
    from zmqflow.inputs.datasets import mnist_split
    from zmqflow.models.registry import load_model
    path = tmp_path / "bn_model.py"
    path.write_text(BATCH_NORM_MODEL)
    code, out, err = train("--model", f"{path}:build", "--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["test_accuracy"] > 0.7
    checkpoint = Checkpoint(latest_checkpoint(str(tmp_path / "ckpt")))
    params = {v.name: checkpoint.read(v.name)[0] for v in checkpoint.variables()}
    assert np.abs(params["batch_normalization/moving_mean"]).max() > 0.01        # moved from its zeros
    assert np.abs(params["batch_normalization/moving_variance"] - 1).max() > 0.01
    _, (x, _) = mnist_split()
    model = load_model(checkpoint.config["model"])
    # the chief recorded the model file's sha256: a server trusting the checkpoint's code builds it while it matches
    assert checkpoint.config["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    server = processes.service("zmqflow.services.serve", ["--checkpoint", str(tmp_path / "ckpt"), "--backend", "numpy",
                                                          "--trust-checkpoint-code"])
    with ModelClient(server.endpoint) as client:
        served, _ = client.predict(x[:50])
    np.testing.assert_allclose(served, model.predict(params, x[:50]), rtol=1e-4, atol=1e-5)


DIVERGING_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense
from zmqflow.models.network import Sequential


class Diverging(LayerModel):
    def step(self, params, batch):
        loss, grads, metrics = super().step(params, batch)
        return (float("nan") if self._steps > 3 else loss), grads, metrics


def build(input_signature):
    (shape, _), = input_signature.values()
    return Diverging(Sequential([Dense(10)], input_shape=shape))
'''


def test_a_nan_loss_ends_the_job_non_zero_naming_the_step(tmp_path):
    path = tmp_path / "diverging.py"
    path.write_text(DIVERGING_MODEL)
    code, out, err = train("--model", f"{path}:build", "--epochs", "2", timeout=120)
    assert code != 0
    assert "the loss of step 3" in err and "is nan" in err and "its gradients were not pushed" in err, err[-3000:]


def test_a_sparse_embedding_table_over_two_shards_moves_only_the_rows_each_step_reads(tmp_path):
    """The example users run: 2 ps shards each holding half of a 20,000-row table, 2 worker processes (one epoch
    of its three here: `make examples` runs all three)."""
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, "sparse_embedding.py"), "--epochs", "1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    found = re.search(r"test RMSE ([\d.]+) .*the ps sent ([\d.]+) KiB per step for tables of (\d+) KiB", done.stdout)
    rmse, per_step, table = (float(g) for g in found.groups())
    assert rmse < 0.5                       # 0.31 in one epoch (0.23 in three); the ratings' standard deviation is 1.46
    assert per_step * 20 < table            # 16 KiB of rows and dense layers a step, against a 1281 KiB table


PIPELINE_MODEL = os.path.join(EXAMPLES, "pipeline_model.py")


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_model_split_over_two_workers_trains_as_a_pipeline(mode):
    code, out, err = train("--model", f"{PIPELINE_MODEL}:build", "--model-opt", "width=128", "--num-workers", "2",
                           "--epochs", "3", "--mode", mode)
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0] and summary["test_accuracy"] > 0.8, summary
    assert summary["global_step"] == 3 * 4500 // 100       # one replica: one step per batch
    code, _, err = train("--model", f"{PIPELINE_MODEL}:build", "--num-workers", "3", timeout=60)
    assert code == 2 and "run on 2 workers (a pipeline); pass --num-workers 2" in err


def replica_results(summary, stages):
    """Each copy of the pipeline's stage-0 result ({"replica", "steps", ...}), from the job's log directory."""
    results = []
    for worker in range(0, summary["num_workers"], stages):
        with open(os.path.join(summary["log_dir"], f"worker{worker}-result.json")) as f:
            results.append(json.load(f))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("mode, epochs, model", [
    ("sync", 2, ["--model", f"{PIPELINE_MODEL}:build", "--model-opt", "width=64"]),   # split by device strings
    # the built-in MLP split here; its input held on the ps and sliced per copy, so each copy's share is fixed (from a
    # shared queue one copy may take nearly every batch: 4 and 41 steps under load)
    ("async", 1, ["--model-opt", "pipeline={softmax: 1}", "--input", "ps"]),
])
def test_two_copies_of_a_two_stage_pipeline_train_on_four_workers(mode, epochs, model):
    """Workers 0-1 and 2-3 are two copies of the pipeline, each reading its own batches and pushing as one
    replica: in sync the ps aggregates both copies' gradients into each step, in async each push is one."""
    code, out, err = train(*model, "--num-workers", "4", "--epochs", str(epochs), "--mode", mode)
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0, 0, 0], summary
    replicas = replica_results(summary, 2)
    steps = [r["steps"] for r in replicas]
    assert [r["replica"] for r in replicas] == [0, 1] and min(steps) >= 10, replicas   # both copies trained
    assert sum(r["examples"] for r in replicas) == epochs * 4500
    if mode == "sync":            # every global step waited for both copies' gradients
        assert max(steps) <= summary["global_step"] < sum(steps), (summary["global_step"], steps)
        assert summary["test_accuracy"] > 0.8, summary
    else:                         # every push of both copies applied
        assert summary["global_step"] == sum(steps), (summary["global_step"], steps)


BRANCHING_MODEL = os.path.join(EXAMPLES, "branching_model.py")


@pytest.mark.slow
def test_a_branching_model_trains_on_four_workers():
    """An input stage, two parallel branches and a join, each on its own worker process."""
    code, out, err = train("--model", f"{BRANCHING_MODEL}:build", "--num-workers", "4", "--epochs", "1")
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["worker_exit_codes"] == [0, 0, 0, 0] and summary["test_accuracy"] > 0.8, summary
    assert summary["global_step"] == 4500 // 100           # one copy of the pipeline: one step per batch


def test_a_branching_model_on_four_worker_processes_steps_as_on_one_worker(processes, tmp_path):
    """One batch through the DAG (stage 0 feeds stages 1 and 2, stage 3 joins them) with SGD: the ps's
    variables move by exactly the learning rate times the one-worker gradients, and the loss is the same."""
    spec = {"type": f"{BRANCHING_MODEL}:build", "width": 16, "branch": 8}
    model, learning_rate = json.dumps(spec), 0.5
    broker = processes.service("zmqflow.services.broker").endpoint
    sgd = json.dumps({"kind": "sgd", "learning_rate": learning_rate})
    ps = processes.service("zmqflow.services.ps", ["--model", model, "--optimizer", sgd]).endpoint
    common = ["--broker", broker, "--ps", ps, "--num-workers", "4", "--model", model, "--batch-size", "8",
              "--pipeline-timeout-secs", "30"]
    endpoints = {3: processes.service("zmqflow.services.worker", ["--task-index", "3", *common]).endpoint}
    for k in (1, 2):
        endpoints[k] = processes.service("zmqflow.services.worker", ["--task-index", str(k), *common,
                                                                     "--pipeline-next", f"3={endpoints[3]}"]).endpoint
    result = tmp_path / "worker0.json"
    links = [arg for k in (1, 2) for arg in ("--pipeline-next", f"{k}={endpoints[k]}")]
    stage0 = processes.process("zmqflow.services.worker", ["--task-index", "0", *common, *links,
                                                           "--json-out", str(result), "--dequeue-timeout-secs", "30"])
    (x, y), _ = mnist_split()
    queue = FIFOQueue(100, ["float32", "int32"], [[784], []], names=["image", "label"], shared_name="train",
                      broker=broker)
    queue.enqueue_many({"image": x[:8], "label": y[:8]})
    queue.close()
    assert stage0.proc.wait(timeout=60) == 0, stage0.log()[-3000:]
    net = load_model(spec)
    first = net.initial_values()
    want_loss, want, _ = net.step(first, (x[:8], y[:8]))
    client = PsClient([ps], place(model_variables(spec), 1))
    after = client.pull()
    client.close()
    assert set(want) == set(after)
    for name, g in want.items():
        np.testing.assert_allclose((first[name] - after[name]) / learning_rate, g, rtol=1e-3, atol=2e-6,
                                   err_msg=name)
    assert json.loads(result.read_text())["final_loss"] == pytest.approx(want_loss, rel=1e-5)


@pytest.mark.faults
def test_a_killed_pipeline_stage_ends_stage_zero_with_the_peer_lost_code(processes, tmp_path):
    """Stage 1 SIGKILLed mid-run: worker 0 stops within its --pipeline-timeout-secs (exit 3, naming the wait)."""
    model = json.dumps({"type": f"{PIPELINE_MODEL}:build", "width": 64})
    broker = processes.service("zmqflow.services.broker").endpoint
    ps = processes.service("zmqflow.services.ps", ["--model", model]).endpoint
    common = ["--broker", broker, "--ps", ps, "--num-workers", "2", "--model", model, "--pipeline-timeout-secs", "3"]
    stage1 = processes.service("zmqflow.services.worker", ["--task-index", "1", *common])
    stage0 = processes.process("zmqflow.services.worker", ["--task-index", "0", "--pipeline-next", stage1.endpoint,
                                                           "--dequeue-timeout-secs", "30", *common])
    queue = FIFOQueue(100_000, ["float32", "int32"], [[784], []], names=["image", "label"], shared_name="train",
                      broker=broker)
    (x, y), _ = mnist_split()
    queue.enqueue_many({"image": x[:2000], "label": y[:2000]})
    wait_for(lambda: PsShardClient(ps).stats()["version"] >= 5, timeout=60, what="the pipeline trained 5 steps")
    stage1.kill()
    queue.enqueue_many({"image": x[:2000], "label": y[:2000]})   # input keeps coming; only the stage is gone
    started = time.monotonic()
    assert stage0.proc.wait(timeout=30) == 3
    assert time.monotonic() - started < 10
    # before every micro-batch's answer it waits for a gradient; after them, for the gathered gradients
    assert re.search(r"no gradients? from stage 1 within 3 s", stage0.log()), stage0.log()[-2000:]
