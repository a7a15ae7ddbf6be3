"""Shared fixtures (processes stopped by PID, a broker per module) and the one-tier-per-test rule."""

import atexit
import os
import secrets
import shutil
import tempfile

# One BLAS/OpenMP/numba thread in every test process and what it starts, unless the caller set one: `make test`
# runs 4 test processes on 2 cores (pytest-xdist), and OpenBLAS's threads spin-wait for work, so a second thread
# per process only burns the cores the other tests need. A job started by a test still caps its own tasks
# (children.compute_thread_env), as in production.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import pytest  # noqa: E402

from tests.support import Processes
from tests.support.tiers import assign_tiers


# the admin-token files services write when no token is given: in a directory of this run, not the user's
os.environ["ZMQFLOW_RUNTIME_DIR"] = _RUNTIME_DIR = tempfile.mkdtemp(prefix="zmqflow-test-runtime-")
atexit.register(shutil.rmtree, _RUNTIME_DIR, True)
# this test run is one job: what its tests start, also by subprocess themselves, are its members (job token);
# the tests of refusals send none or a wrong one explicitly
os.environ.setdefault("ZMQFLOW_JOB_TOKEN", secrets.token_urlsafe(32))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Before `-m` selects: every test gets its one tier, or collection fails naming the tests without."""
    assign_tiers(items)


@pytest.fixture
def processes(tmp_path):
    """A Processes registry for this test: what it starts is stopped at teardown, also when the test failed."""
    registry = Processes(str(tmp_path))
    yield registry
    registry.stop_all()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory):
    """A Processes registry shared by a module's fixtures: stopped after its last test."""
    registry = Processes(str(tmp_path_factory.mktemp("processes")))
    yield registry
    registry.stop_all()


@pytest.fixture(scope="module")
def broker_process(module_processes):
    """A real broker process on an ephemeral loopback port, stopped by PID after the module."""
    return module_processes.service("zmqflow.services.broker", ["--client-timeout-secs", "3"])


@pytest.fixture
def broker(broker_process):
    assert broker_process.alive(), broker_process.log()
    return broker_process.endpoint
