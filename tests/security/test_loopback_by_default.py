"""Services listen on loopback unless told otherwise: every service command's default --bind."""

import pytest

from zmqflow.common.rpc.encryption import is_loopback
from zmqflow.cli.main import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["broker", "ps", "serve", "aggregator", "worker"])
def test_every_service_binds_loopback_unless_told_otherwise(name):
    command = main.get_command(None, name)
    [bind] = [p for p in command.params if p.name == "bind"]
    endpoint = bind.type.convert(bind.default, bind, None)   # what the service binds: --bind read as given
    assert endpoint.startswith("tcp://127.0.0.1:") and is_loopback(endpoint), (name, bind.default)


@pytest.mark.parametrize("bare", ["5555", "0"])
def test_a_bare_port_is_on_loopback(bare):
    """--bind PORT (V5, docs/cli.md) names no host: loopback, never every interface."""
    from zmqflow.common.bind import parse_bind
    assert is_loopback(parse_bind(bare).zmq_endpoint())
    assert parse_bind(bare, zmq=False).socket_address()[0] == "127.0.0.1"
