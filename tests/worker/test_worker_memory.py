"""Issue 27, found by the soak tier: a worker kept every step's loss (32 bytes a step, about 660 MB a day at 240 steps
a second) though its summary needs only the last 20. Its memory must not grow with the steps it takes."""

import numpy as np
import pytest

import zmqflow
from zmqflow.services.worker.trainer import FINAL_LOSS_STEPS
from tests.worker.test_session_hooks import logistic_ps

pytestmark = pytest.mark.service

STEPS = 300


def test_a_worker_keeps_only_the_losses_its_summary_needs(tmp_path):
    with logistic_ps(tmp_path) as (_, train, cluster, model):
        server = zmqflow.Server(cluster, "worker", 0, model=model)
        rng = np.random.default_rng(0)
        with zmqflow.MonitoredTrainingSession(server) as sess:
            losses = [sess.run(*train.batch(rng.integers(0, train.rows, 50))) for _ in range(STEPS)]
            kept = list(sess.trainer.losses)
    assert kept == losses[-FINAL_LOSS_STEPS:]
