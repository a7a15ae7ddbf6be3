"""Services listen on loopback unless told otherwise: every service command's default --bind."""

import pytest

from zmqflow.common.rpc.encryption import is_loopback
from zmqflow.cli.main import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["broker", "ps", "serve", "aggregator", "worker"])
def test_every_service_binds_loopback_unless_told_otherwise(name):
    command = main.get_command(None, name)
    [bind] = [p for p in command.params if p.name == "bind"]
    assert bind.default.startswith("tcp://127.0.0.1:") and is_loopback(bind.default), (name, bind.default)
