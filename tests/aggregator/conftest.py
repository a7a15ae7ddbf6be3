import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.processes.children import start_service
from tests.aggregator.fakes import FakeMember


@pytest.fixture
def fakes():
    """make(n, **options) -> n running fake members (offsets 0..n-1); all shut down after the test."""
    made = []

    def make(n, **options):
        members = [FakeMember(offset=float(len(made) + i), **options).start() for i in range(n)]
        made.extend(members)
        return members

    yield make
    for member in made:
        member.shutdown()


@pytest.fixture
def aggregator(tmp_path):
    """start(members, *args) -> (process, client) of a real aggregator process; stopped after the test."""
    started = []

    def start(members, *args):
        member_args = [a for m in members for a in ("--member", m if isinstance(m, str) else m.endpoint)]
        proc = start_service("zmqflow.services.aggregator", [*member_args, *args], log_dir=str(tmp_path))
        client = AggregatorClient(proc.endpoint, timeout=10.0)
        started.append((proc, client))
        return proc, client

    yield start
    for proc, client in started:
        client.close()
        assert proc.stop() == 0, proc.log()
