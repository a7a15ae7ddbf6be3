"""The open-loop driver (no sockets, on a virtual clock) and the aggregator load test against real servers."""

import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.loadtest import open_loop
from zmqflow.loadtest.open_loop import run_open_loop

pytestmark = pytest.mark.faults


class VirtualClock:
    """Time that moves only when the driver waits: the schedule is checked exactly, not against a busy machine."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


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


@pytest.mark.unit
def test_requests_leave_on_schedule_whatever_the_answers_take(monkeypatch):
    clock, sent = VirtualClock(), []
    monkeypatch.setattr(open_loop, "time", clock)

    def submit():
        sent.append(clock.perf_counter())
        return FakePending(clock.perf_counter, 0.05, fail=len(sent) % 10 == 0)  # answers slower than arrivals

    run = run_open_loop(submit, clock.sleep, rate=200, duration=0.5)
    summary = run.summary()
    assert summary["requests"] == 100 and len(sent) == 100  # open loop: not throttled by the 50 ms answers
    assert summary["failed"] == 10 and summary["errors"] == {"TimeoutError": 10}
    assert sent == pytest.approx([i / 200 for i in range(100)], abs=1e-9)  # each leaves when it is due
    assert 50 <= summary["p50_ms"] <= 55  # latency counts from the due time: the 50 ms answer, seen within a poll


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    write_random_checkpoint(ckpt)
    return ckpt


def test_load_test_with_a_member_killed_half_way(checkpoint_dir, processes, tmp_path):
    members = [processes.service("zmqflow.services.serve", ["--checkpoint", checkpoint_dir, "--backend", "numpy"])
               for _ in range(3)]
    aggregator = processes.service("zmqflow.services.aggregator",
                                   [a for m in members for a in ("--member", m.endpoint)])
    out = tmp_path / "load.json"
    result = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--address", aggregator.endpoint,
                             "--rate", "200", "--duration-secs", "2", "--deadline-ms", "100", "--kill-member", "1",
                             "--json-out", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "after_fault" in result.stdout and "p99.9 ms" in result.stdout
    report = json.loads(out.read_text())
    assert report["overall"]["requests"] == 400
    assert report["overall"]["failed"] == 0, report  # the ensemble answers without the dead member
    assert report["partial_answers"] > 0 and "kill member" in report["events"][0][1]
    assert not members[1].alive()


def test_max_failures_and_wait_secs_set_the_exit_code(processes, tmp_path):
    from tests.support import free_port
    nobody = f"tcp://127.0.0.1:{free_port()}"
    waited = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--address", nobody, "--wait-secs", "1",
                             "--duration-secs", "1"], capture_output=True, text=True, timeout=60)
    assert waited.returncode == 1 and f"{nobody} did not answer within 1 s" in waited.stderr
    # an aggregator whose only member never answers: every request fails
    aggregator = processes.service("zmqflow.services.aggregator", ["--member", nobody])
    argv = [sys.executable, "-m", "zmqflow", "loadtest", "--address", aggregator.endpoint, "--rate", "20",
            "--duration-secs", "0.5", "--deadline-ms", "50", "--wait-secs", "10"]
    tolerant = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert tolerant.returncode == 0, tolerant.stderr          # no --max-failures: a report, not a verdict
    strict = subprocess.run(argv + ["--max-failures", "0"], capture_output=True, text=True, timeout=60)
    assert strict.returncode == 1 and "requests failed (at most 0 allowed)" in strict.stderr
