import pytest

from zmqflow.common.processes import start_service


@pytest.fixture(scope="module")
def broker_process(tmp_path_factory):
    """A real broker process on an ephemeral loopback port, stopped by PID after the module."""
    proc = start_service("zmqflow.services.broker", ["--client-timeout", "3"], log_dir=str(tmp_path_factory.mktemp("broker")))
    yield proc
    proc.stop()


@pytest.fixture
def broker(broker_process):
    assert broker_process.alive(), broker_process.log()
    return broker_process.endpoint
