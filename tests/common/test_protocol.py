"""Op names live in common/protocol.py only: services register them, clients send them, nobody spells them."""

import ast
import inspect
import pathlib
import textwrap

import pytest

from zmqflow.common.protocol import AggregatorOps, BrokerOps, Ops, PsOps, ServeOps, ops_of
from zmqflow.services.aggregator.server import Aggregator
from zmqflow.services.broker.server import BrokerService
from zmqflow.services.ps.server import PsService
from zmqflow.services.serve.server import ModelServer

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("common", "models", "inputs", "services", "jobs", "cli", "bench", "loadtest")
RPC_INTERNALS = {"common/rpc_client.py", "common/rpc_service.py"}


def handler_names(cls):
    """The ops a service class registers, read from its source (no socket is bound)."""
    source = textwrap.dedent(inspect.getsource(cls.__init__))
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Ops"):
            names.add(getattr(globals()[node.value.id], node.attr) if node.attr != "QUEUE_OPS" else node.attr)
    return names


@pytest.mark.parametrize("cls, ops", [(BrokerService, BrokerOps), (PsService, PsOps), (ModelServer, ServeOps),
                                      (Aggregator, AggregatorOps)])
def test_every_service_registers_exactly_its_ops(cls, ops):
    registered = handler_names(cls)
    declared = ops_of(ops)
    if "QUEUE_OPS" in registered:
        registered = (registered - {"QUEUE_OPS"}) | set(BrokerOps.QUEUE_OPS)
    assert registered == declared


def test_every_service_answers_the_common_ops():
    assert ops_of(Ops) == {"ping", "cancel", "bye", "info"}


def _raw_calls(path):
    """`x.call("op", ...)` / `x.submit("op", ...)`: an op spelled as a string literal."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("call", "submit", "_call", "_submit", "_send") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def test_no_op_is_spelled_as_a_string_outside_the_protocol_module():
    found = []
    for layer in LAYERS:
        for path in (REPO / layer).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            found += [f"{rel}:{line}: {op!r}" for line, op in _raw_calls(path)]
    assert not found, "use the constants of zmqflow.common.protocol (and a typed client):\n" + "\n".join(found)
