"""Ops are declared in common/wire/protocol.py only: services serve the declarations, clients send them, nobody
spells an op, its checks live in the declaration, and docs/protocol.md is rendered from it."""

import ast
import inspect
import pathlib
import textwrap

import pytest

from zmqflow.common.wire import protocol
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.wire.protocol import AggregatorOps, BrokerOps, EnsembleServeOps, Ops, PsOps, ServeOps, requests_of
from zmqflow.services.aggregator.server import Aggregator
from zmqflow.services.broker.server import BrokerService
from zmqflow.services.ps.server import PsService
from zmqflow.services.serve.ensemble import EnsembleServer
from zmqflow.services.serve.server import ModelServer

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("common", "models", "inputs", "services", "jobs", "cli", "bench", "loadtest")
RPC_INTERNALS = {"common/rpc/client.py", "common/rpc/service.py"}


def handler_names(cls):
    """The ops a service class registers, read from its source (no socket is bound)."""
    source = textwrap.dedent(inspect.getsource(cls.__init__))
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Ops"):
            declared = getattr(globals()[node.value.id], node.attr)
            names |= {r.OP for r in declared} if isinstance(declared, tuple) else {declared.OP}
    return names


@pytest.mark.parametrize("cls, ops", [(BrokerService, BrokerOps), (PsService, PsOps), (ModelServer, ServeOps),
                                      (Aggregator, AggregatorOps), (EnsembleServer, EnsembleServeOps)])
def test_every_service_registers_exactly_its_ops(cls, ops):
    assert cls.protocol is ops
    assert handler_names(cls) == set(requests_of(ops))


def test_every_service_answers_the_common_ops():
    assert set(requests_of(Ops)) == {"ping", "cancel", "bye", "info"}


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
    assert not found, "use the constants of zmqflow.common.wire.protocol (and a typed client):\n" + "\n".join(found)


def test_the_op_table_in_the_docs_is_rendered_from_the_declarations():
    assert (REPO / "docs" / "protocol.md").read_text() == protocol.markdown(), \
        "docs/protocol.md is stale: python -m zmqflow.common.wire.protocol > docs/protocol.md"


def test_a_declaration_encodes_what_its_validation_takes_back():
    push = PsOps.Push(version=7, names=["w", "b"], replica=2, bf16=True)
    assert push.encode() == {"version": 7, "names": ["w", "b"], "replica": 2, "sparse": (), "bf16": True}
    assert PsOps.Push.validate({**push.encode(), "sparse": []}) == PsOps.Push(7, ["w", "b"], 2, [], True)
    assert BrokerOps.Dequeue(3).encode() == {"queue": 3}    # fields left None are not sent
    assert BrokerOps.DequeueMany.validate({"queue": 3, "n": 2, "lease": 30}).lease == 30.0


@pytest.mark.parametrize("request_, args, message", [
    (BrokerOps.DequeueMany, {"queue": 1}, "dequeue_many needs n: an int"),
    (BrokerOps.DequeueMany, {"queue": 1, "n": True}, "dequeue_many's n must be an int, got True"),
    (BrokerOps.Dequeue, {"queue": 1, "lease": 0}, r"dequeue's lease must be a number of seconds in \(0, 3600\]"),
    (BrokerOps.Enqueue, {"queue": 1, "n": 2}, r"enqueue takes no 'n' \(it takes queue\)"),
    (BrokerOps.AttachQueue, {"shared_name": ""}, "attach_queue's shared_name must be a non-empty string, got ''"),
    (PsOps.Push, {"version": 1, "names": ["a", 3]},
     r"push's names must be a list of non-empty strings, got \['a', 3\]"),
    (PsOps.Save, {"dir": "d", "metadata": {"a": 1}}, "save's metadata must be a map of strings or null"),
    (PsOps.Pull, {"min_version": "3"}, "pull's min_version must be an int or null, got '3'"),
    (AggregatorOps.Predict, {"deadline_ms": 0}, "predict's deadline_ms must be >= 1, got 0"),
    (AggregatorOps.Predict, {"mode": "all"}, "predict's mode must be one of ensemble, replica, got 'all'"),
    (AggregatorOps.Predict, {"sent_at": float("nan")}, "predict's sent_at must be a number or null, got nan"),
    (Ops.Ping, {"ids": "1"}, "ping's ids must be a list of ints"),
])
def test_validation_names_the_op_and_the_field(request_, args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        request_.validate(args)


def test_every_op_declares_who_may_send_it():
    for table in protocol.TABLES.values():
        for request in requests_of(table).values():
            assert request.ROLE in protocol.ROLES
    assert protocol.ADMIN_OPS == {"reset", "shutdown", "init", "restore", "add_member", "remove_member", "finish"}
