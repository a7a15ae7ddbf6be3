"""Issue 27, found by the soak tier: a worker kept every step's loss (32 bytes a step, about 660 MB a day at 240 steps
a second) though its summary needs only the last 20. Its memory must not grow with the steps it takes."""

import threading

import numpy as np
import pytest

import zmqflow
from zmqflow.inputs.data_spec import load_tables, model_for_data, prepare
from zmqflow.services.worker.trainer import FINAL_LOSS_STEPS
from tests.support.ports import free_port
from tests.worker.test_session_hooks import points_spec

pytestmark = pytest.mark.service

STEPS = 300


def test_a_worker_keeps_only_the_losses_its_summary_needs(tmp_path):
    spec = points_spec(tmp_path)
    train = prepare(spec, load_tables(spec)["train"])
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    model = model_for_data(spec, {"type": "logistic"})
    ps = zmqflow.Server(cluster, "ps", 0, model=model, optimizer={"kind": "adam", "learning_rate": 0.05})
    thread = threading.Thread(target=ps.join, daemon=True)
    thread.start()
    try:
        server = zmqflow.Server(cluster, "worker", 0, model=model)
        rng = np.random.default_rng(0)
        with zmqflow.MonitoredTrainingSession(server) as sess:
            losses = [sess.run(*train.batch(rng.integers(0, train.rows, 50))) for _ in range(STEPS)]
            kept = list(sess.trainer.losses)
    finally:
        ps.service.stop()
        thread.join(timeout=10)
    assert kept == losses[-FINAL_LOSS_STEPS:]
