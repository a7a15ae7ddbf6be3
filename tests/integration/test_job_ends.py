"""A job ends, always: whichever of its tasks is killed mid-run, `wait()` stops every other task and
raises naming the task, how it ended and its last log lines; no process of the job survives."""

import os
import signal
import time

import pytest

from tests.support.processes import alive
from tests.support.waiting import wait_for
from zmqflow.common.errors import AbortedError
from zmqflow.jobs.local_cluster import LocalCluster

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("role", ["broker", "ps0", "worker0", "worker1", "reader0"])
def test_killing_any_task_ends_the_whole_job_naming_it(tmp_path, role):
    with LocalCluster(num_ps=1, num_workers=2, epochs=400, log_dir=str(tmp_path)) as cluster:
        cluster.start()
        wait_for(lambda: cluster.ps_stats(0)["version"] > 20, 60, "20 steps", retry_on=Exception)
        victim = next(c for c in cluster.supervisor.children if c.name == role)
        pids = [c.pid for c in cluster.supervisor.children]
        os.killpg(victim.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(AbortedError, match=rf"task {role} was killed by signal 9; the job stopped its other tasks"):
            cluster.wait(timeout=120)
        took = time.monotonic() - started
    assert took < 30, took          # noticed within the workers' own timeouts at worst
    assert not [pid for pid in pids if alive(pid)]
