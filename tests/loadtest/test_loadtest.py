"""The open-loop driver (no sockets) and the aggregator load test against real servers."""

import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.common.processes import start_service
from zmqflow.loadtest.open_loop import run_open_loop


class FakePending:
    def __init__(self, clock, answer_after, fail=False):
        self.clock, self.ready_at, self.fail = clock, clock() + answer_after, fail

    @property
    def done(self):
        return self.clock() >= self.ready_at

    def result(self):
        if self.fail:
            raise TimeoutError("no")
        return None, {}


def test_requests_leave_on_schedule_whatever_the_answers_take():
    import time
    sent = []

    def submit():
        sent.append(time.perf_counter())
        return FakePending(time.perf_counter, 0.05, fail=len(sent) % 10 == 0)  # answers slower than arrivals

    run = run_open_loop(submit, lambda t: time.sleep(t), rate=200, duration=0.5)
    summary = run.summary()
    assert summary["requests"] == 100 and len(sent) == 100  # open loop: not throttled by the 50 ms answers
    assert summary["failed"] == 10 and summary["errors"] == {"TimeoutError": 10}
    assert 45 <= summary["p50_ms"] < 150  # latency counts from the due time
    assert sent[-1] - sent[0] == pytest.approx(99 / 200, abs=0.1)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    write_random_checkpoint(ckpt)
    return ckpt


def test_load_test_with_a_member_killed_half_way(checkpoint_dir, tmp_path):
    members = [start_service("zmqflow.services.serve", ["--checkpoint", checkpoint_dir, "--backend", "numpy"],
                             log_dir=str(tmp_path)) for _ in range(3)]
    procs = list(members)
    try:
        aggregator = start_service("zmqflow.services.aggregator", [a for m in members for a in ("--member", m.endpoint)],
                                   log_dir=str(tmp_path))
        procs.append(aggregator)
        out = tmp_path / "load.json"
        result = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--address", aggregator.endpoint,
                                 "--rate", "200", "--duration", "2", "--deadline-ms", "100", "--kill-member", "1",
                                 "--json-out", str(out)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "after_fault" in result.stdout and "p99.9 ms" in result.stdout
        report = json.loads(out.read_text())
        assert report["overall"]["requests"] == 400
        assert report["overall"]["failed"] == 0, report  # the ensemble answers without the dead member
        assert report["partial_answers"] > 0 and "kill member" in report["events"][0][1]
        assert not members[1].alive()
    finally:
        for p in procs:
            p.stop()
