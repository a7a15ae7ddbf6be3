"""A real model server process over a checkpoint written by a real ps shard."""

import json
import threading

import numpy as np
import pytest

from zmqflow.common.errors import DeadlineExceededError, InvalidArgumentError
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model, model_variables
from zmqflow.common.cluster.placement import place
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.clients.serve import ModelClient
from zmqflow.common.checkpoints.checkpoint import Checkpoint, latest_checkpoint
from tests.support import wait_for

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory, module_processes):
    """A checkpoint of step 1 written by a real ps shard (stopped once it is written)."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    proc = module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP),
                                                            "--checkpoint-root", str(ckpt)])
    ps = PsClient([proc.endpoint], place(model_variables(MNIST_MLP), 1))
    values = load_model(MNIST_MLP).initial_values(1)
    ps.initialize(values)
    ps.push({k: np.full_like(v, 0.01) for k, v in values.items()})  # step 1, not the initial values
    ps.save(str(ckpt), config={"model": MNIST_MLP})
    ps.close()
    proc.stop()
    return str(ckpt)


@pytest.fixture(scope="module")
def server(checkpoint_dir, module_processes):
    return module_processes.service("zmqflow.services.serve", ["--checkpoint", checkpoint_dir, "--backend", "numpy",
                                                               "--max-delay-secs", "0.02", "--model-name", "mnist"])


def local_predict(checkpoint_dir, x):
    model = load_model(MNIST_MLP)
    ckpt = Checkpoint(latest_checkpoint(checkpoint_dir))
    return model.predict({v.name: ckpt.read(v.name)[0] for v in model.variables()}, x)


def test_predictions_match_the_checkpoint(server, checkpoint_dir):
    x = np.random.default_rng(0).random((5, 784), dtype=np.float32)
    with ModelClient(server.endpoint, timeout=10) as client:
        probs, info = client.predict(x)
        assert info["model"] == "mnist" and info["version"] == 1
        assert probs.shape == (5, 10) and probs.dtype == np.float32
        np.testing.assert_allclose(probs, local_predict(checkpoint_dir, x), rtol=1e-5, atol=1e-6)
        meta = client.model_info()
        assert meta["inputs"] == 784 and meta["classes"] == 10 and meta["version"] == 1


def test_concurrent_requests_are_batched_and_each_gets_its_rows(server, checkpoint_dir):
    threads, n = 8, 5
    inputs = [np.random.default_rng(i).random((1 + i % 3, 784), dtype=np.float32) for i in range(threads * n)]
    answers, errors = {}, []
    barrier = threading.Barrier(threads)
    with ModelClient(server.endpoint) as c:
        before = c.model_info()["stats"]

    def work(t):
        try:
            with ModelClient(server.endpoint, timeout=10) as client:
                barrier.wait()
                pending = [(i, client.predict_async(inputs[i])) for i in range(t, len(inputs), threads)]
                for i, p in pending:
                    answers[i] = p.result()[0]
        except Exception as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not errors and len(answers) == len(inputs)
    expected = local_predict(checkpoint_dir, np.concatenate(inputs))
    start = 0
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(answers[i], expected[start:start + len(x)], rtol=1e-5, atol=1e-6)
        start += len(x)
    with ModelClient(server.endpoint) as c:
        after = c.model_info()["stats"]
    requests, batches = after["predictions"] - before["predictions"], after["batches"] - before["batches"]
    assert requests == len(inputs) and batches < requests


def test_a_too_short_deadline_is_deadline_exceeded(server):
    with ModelClient(server.endpoint) as client:
        with pytest.raises(DeadlineExceededError):
            client.predict(np.zeros((1, 784), np.float32), timeout=0.001)  # the batch waits 20 ms
        assert client.predict(np.zeros((1, 784), np.float32), timeout=5)[0].shape == (1, 10)


def test_a_bad_shape_is_invalid_argument_and_the_server_keeps_serving(server):
    with ModelClient(server.endpoint, timeout=5) as client:
        with pytest.raises(InvalidArgumentError, match="784"):
            client.predict(np.zeros((2, 10), np.float32))
        with pytest.raises(InvalidArgumentError):
            client.predict(np.zeros((784,), np.float32))
        assert client.predict(np.ones((3, 784), np.float32))[0].shape == (3, 10)
    assert server.alive()


@pytest.mark.integration
def test_follow_ps_serves_the_shards_latest_version(processes):
    ps_proc = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    ps = PsClient([ps_proc.endpoint], place(model_variables(MNIST_MLP), 1))
    values = load_model(MNIST_MLP).initial_values(1)
    ps.initialize(values)
    serve_proc = processes.service("zmqflow.services.serve", ["--ps", ps_proc.endpoint, "--refresh-secs", "0.1",
                                                              "--backend", "numpy"])
    with ModelClient(serve_proc.endpoint, timeout=5) as client:
        version = lambda: client.predict(np.zeros((1, 784), np.float32))[1]["version"]  # noqa: E731
        assert version() == 0
        ps.push({k: np.full_like(v, 0.01) for k, v in values.items()})
        wait_for(lambda: version() == 1, 10, "the server to pick up version 1")
    ps.close()


def test_a_worker_in_serve_mode_answers_predictions(checkpoint_dir, processes):
    proc = processes.service("zmqflow.services.worker", ["--serve", checkpoint_dir, "--backend", "numpy"])
    x = np.random.default_rng(2).random((3, 784), dtype=np.float32)
    with ModelClient(proc.endpoint, timeout=10.0) as client:
        probabilities, info = client.predict(x)
    np.testing.assert_allclose(probabilities, local_predict(checkpoint_dir, x), rtol=1e-4, atol=1e-6)
    assert info["version"] == 1
