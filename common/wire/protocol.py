"""The protocol, declared once: every op of every service, its arguments, its answer and who may send it.

Each op is one small dataclass (a `Request`): its fields are the request's `args`, its class
keywords the role that may send it and the fields of its answer, its docstring what it does and
which tensors travel with it. Clients build the dataclass and send `encode()`; the service base
(common/rpc/service.py) checks a request's sender against the declared role (`Service._authorize`,
the one check point) and turns its args into the dataclass with `validate` before the handler runs, so a
handler reads typed fields and a bad one is INVALID_ARGUMENT naming op and field. The wire header
and the tensor frames are common/wire/frames.py's; docs/protocol.md is rendered from here
(`python -m zmqflow.common.wire.protocol`, and a test fails when it differs).

Roles: `client` (anyone who may reach the service: serving requests and read-only introspection),
`member` (a job's own processes: what changes or reads a job's queues, variables and data), `admin`
(changes what the service is or stops it). Each guarded role has its credential: without CURVE the
job token (member) or the admin token (admin), common/rpc/admin_token.py; with CURVE the roles granted
to the client's key (common/rpc/encryption.py). docs/security.md says who holds which.
"""

import dataclasses
import math
import re
import types
import typing
from typing import Annotated, Any

from zmqflow.common.errors import InvalidArgumentError, shown

VERSION = 1
"""The `v` of every request and reply header; a service refuses any other."""

CLIENT, MEMBER, ADMIN = "client", "member", "admin"
ROLES = (CLIENT, MEMBER, ADMIN)
Name = typing.NewType("Name", str)
"""A non-empty string."""
_REQUIRED = dataclasses.MISSING


# ---------------------------------------------------------------- field checks


def at_least(low):
    def check(value, what):
        if value < low:
            raise InvalidArgumentError(f"{what} must be >= {low}, got {shown(value)}")
        return value
    check.__doc__ = f">= {low}"
    return check


def one_of(*choices):
    def check(value, what):
        if value not in choices:
            raise InvalidArgumentError(f"{what} must be one of {', '.join(choices)}, got {shown(value)}")
        return value
    check.__doc__ = " \\| ".join(choices)
    return check


MAX_LEASE_SECONDS = 3600.0
"""The longest lease one request may ask for; a longer task renews it with `extend`."""


def lease_seconds(value, what="lease"):
    """`value` as float seconds in (0, MAX_LEASE_SECONDS], else InvalidArgument naming it."""
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value <= MAX_LEASE_SECONDS:
        raise InvalidArgumentError(f"{what} must be a number of seconds in (0, {MAX_LEASE_SECONDS:g}], "
                                   f"got {shown(value)}")
    return float(value)


lease_seconds.__doc__ = f"seconds in (0, {MAX_LEASE_SECONDS:g}]"
def progress_report(value, what):
    """A producer's progress with the fields the broker names when it vanishes (producers.py) of their kind:
    a hostile `reading` once crashed the broker's loop when its producer vanished."""
    if type(value.get("reading", [])) is not list or not all(type(r) is str for r in value.get("reading", [])) \
            or not all(type(value.get(k, 0)) is int for k in ("instances", "files_done")):
        raise InvalidArgumentError(f"{what} must be a map whose reading is a list of strings and instances, "
                                   f"files_done ints, got {shown(value)}")
    return value


progress_report.__doc__ = "reading: strings, instances, files_done: ints"
Positive = Annotated[int, at_least(1)]
Seconds = Annotated[Any, lease_seconds]  # checks its type itself: its message names the bounds
Progress = Annotated[dict, progress_report]

_KINDS = {
    int: ("an int", lambda v: type(v) is int),
    float: ("a number", lambda v: type(v) in (int, float) and math.isfinite(v)),
    bool: ("true or false", lambda v: type(v) is bool),
    str: ("a string", lambda v: type(v) is str),
    Name: ("a non-empty string", lambda v: type(v) is str and v != ""),
    dict: ("a map", lambda v: type(v) is dict),
    list: ("a list", lambda v: type(v) is list),
    Any: ("anything", lambda v: True),
}


def _kind(hint):
    """(words, test) of a field type: a scalar of _KINDS, `list[X]` or `dict[str, str]`."""
    origin, inner = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        words, test = _kind(inner[0])
        return f"a list of {words.split(' ', 1)[1]}s", lambda v: type(v) is list and all(map(test, v))
    if origin is dict:
        (_, key), (_, value) = _kind(inner[0]), _kind(inner[1])
        return "a map of strings", lambda v: type(v) is dict and all(map(key, v)) and all(map(value, v.values()))
    return _KINDS[hint]


def _checker(op, name, hint):
    """value -> value for field `name` of `hint` (`X | None`, `Annotated[X, check]`), or InvalidArgumentError."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    if optional:
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
    extra = hint.__metadata__[0] if typing.get_origin(hint) is Annotated else None
    words, test = _kind(hint.__origin__ if extra else hint)
    what = f"{op}'s {name}"

    def check(value):
        if value is None and optional:
            return None
        if not test(value):
            raise InvalidArgumentError(f"{what} must be {words}{' or null' if optional else ''}, got {shown(value)}")
        return value if extra is None else extra(value, what)
    if extra is not None:
        words = extra.__doc__ if words == "anything" else f"{words} ({extra.__doc__})"
    check.words = words + (" or null" if optional else "")
    return check


# ---------------------------------------------------------------- declarations


class Request:
    """Base of an op's declaration. `class Push(Request, role=MEMBER, answer="..."):` with typed fields.

    OP: the op's name on the wire (the class name in snake case); ROLE: who may send it; ANSWER: the
    fields of its answer (docs/protocol.md)."""

    OP = ROLE = ANSWER = WHAT = None

    def __init_subclass__(cls, role=CLIENT, answer="", **kwargs):
        super().__init_subclass__(**kwargs)
        if role not in ROLES:
            raise ValueError(f"{cls.__name__}: role must be one of {ROLES}, got {role!r}")
        cls.WHAT = " ".join((cls.__dict__.get("__doc__") or "").split())
        dataclasses.dataclass(cls)
        cls.OP = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        cls.ROLE, cls.ANSWER = role, tuple(answer.split())
        hints = typing.get_type_hints(cls, include_extras=True)
        cls._FIELDS = tuple((f.name, f.default, _checker(cls.OP, f.name, hints[f.name]))
                            for f in dataclasses.fields(cls))
        cls._NAMES = frozenset(name for name, _, _ in cls._FIELDS)

    def encode(self):
        """The request's args for the wire header (fields left None are not sent)."""
        return {name: value for name, value in self.__dict__.items() if value is not None}

    @classmethod
    def validate(cls, args):
        """The declaration filled from a request's `args` (a dict off the wire); InvalidArgumentError
        naming op and field for a missing, unknown or ill-typed one."""
        unknown = args.keys() - cls._NAMES
        if unknown:
            takes = ", ".join(name for name, _, _ in cls._FIELDS) or "no arguments"
            raise InvalidArgumentError(f"{cls.OP} takes no {', '.join(sorted(map(repr, unknown)))} (it takes {takes})")
        request = object.__new__(cls)
        fields = request.__dict__
        for name, default, check in cls._FIELDS:
            value = args.get(name, _REQUIRED)
            if value is _REQUIRED:
                if default is _REQUIRED:
                    raise InvalidArgumentError(f"{cls.OP} needs {name}: {check.words}")
                fields[name] = default
            else:
                fields[name] = check(value)
        return request


def requests_of(table):
    """{op name: declaration} of a table class (Ops, BrokerOps, ...)."""
    return {v.OP: v for v in vars(table).values() if isinstance(v, type) and issubclass(v, Request)}


def ops_with_role(table, role):
    return {op for op, request in requests_of(table).items() if request.ROLE == role}


# ---------------------------------------------------------------- the ops


class Ops:
    """Answered by every service (common/rpc/service.py)."""

    class Ping(Request, answer="unknown service max_message_bytes"):
        """Liveness; `unknown`: which of `ids` (the caller's requests in flight) the service no longer holds."""
        ids: list[int] = ()

    class Cancel(Request, answer="cancelled"):
        """Withdraw the caller's parked request `target` (it is answered CANCELLED)."""
        target: int

    class Bye(Request):
        """The caller is leaving: its parked requests are cancelled."""

    class Info(Request, answer="service endpoint pid uptime_s parked timers stats curve metrics"):
        """What the service is (plus its own fields: a shard's version, a broker's queues...)."""


PRODUCERS_STATE = "queue closed closed_by code error at_least_once first producers"
"""What every producer op answers: the queue's end (closed: None, 'ok', 'failed'), its error, each producer."""


class _BatchDequeue(Request):
    """The fields of dequeue_many and dequeue_up_to (a base outside any table: not an op itself)."""
    queue: int
    n: int
    lease: Seconds | None = None


class _ProducerOp(Request):
    """The fields every producer op starts with: the queue, the producer's name, its lease (beat within)."""
    queue: int
    name: Name
    lease: Seconds


class BrokerOps:
    """The queue-broker (services/broker/server.py); `queue` is the handle open_queue answered."""

    class OpenQueue(Request, role=MEMBER, answer="handle created name"):
        """Declare a queue, or attach to the one of that shared name (common/clients/queues.py's declaration)."""
        declaration: dict

    class AttachQueue(Request, role=MEMBER, answer="handle created name declaration"):
        """Attach by name alone and learn the declaration."""
        shared_name: Name
        container: str = ""

    class Size(Request, answer="size"):
        queue: int

    class IsClosed(Request, answer="closed"):
        queue: int

    class Reset(Request, role=ADMIN, answer="container freed"):
        """Free every queue of a container (their pending requests fail)."""
        container: str = ""

    class ListQueues(Request, answer="queues"):
        """One entry per queue: handle, container, name, kind, size, capacity, closed, waiting requests."""

    class Shutdown(Request, role=ADMIN, answer="queues"):
        """The broker exits 0 (the chief's at the end of training)."""
        by: str = "a client"

    class Enqueue(Request, role=MEMBER):
        """Tensors: one per component of the element."""
        queue: int

    class EnqueueMany(Request, role=MEMBER):
        """Tensors: one per component, the elements along the first dimension."""
        queue: int

    class Dequeue(Request, role=MEMBER, answer="lease lease_s"):
        """Answered with one element's components; with `lease`, they stay the broker's until acked."""
        queue: int
        lease: Seconds | None = None

    class DequeueMany(_BatchDequeue, role=MEMBER, answer="lease lease_s"):
        """`n` elements, waiting until there are that many (or the queue is closed: OUT_OF_RANGE)."""

    class DequeueUpTo(_BatchDequeue, role=MEMBER, answer="lease lease_s"):
        """Up to `n` elements: fewer once the queue is closed."""

    class Close(Request, role=MEMBER):
        queue: int
        cancel_pending_enqueues: bool = False

    class Ack(Request, role=MEMBER, answer="lease acked"):
        """The leased elements are consumed for good."""
        lease: int

    class Nack(Request, role=MEMBER, answer="lease returned"):
        """The leased elements go back to their queue."""
        lease: int

    class Extend(Request, role=MEMBER, answer="lease lease_s"):
        lease: int
        seconds: Seconds

    QUEUE_OPS = (Enqueue, EnqueueMany, Dequeue, DequeueMany, DequeueUpTo, Close)
    """The ops on one queue (a handle), served by the queue's own semantics."""

    class RegisterProducer(_ProducerOp, role=MEMBER, answer=PRODUCERS_STATE):
        """Register the caller as a producer of `queue` that beats within `lease` s (zmqflow's extension,
        docs/queue-semantics.md §8): the broker closes the queue when its last producer is done and fails
        it when one vanishes; at least once, a vanished producer's file is read again, `source` (the
        file-name queue) failing with it."""
        at_least_once: bool = False
        rejoin_s: Seconds | None = None
        source: int | None = None

    class Beat(_ProducerOp, role=MEMBER, answer=PRODUCERS_STATE):
        """Alive, with `progress` (named when the broker reports this producer gone)."""
        progress: Progress | None = None

    class ProducerDone(_ProducerOp, role=MEMBER, answer=PRODUCERS_STATE):
        """Every element of this producer is in (`exhausted`: it saw its input's end, not a stop)."""
        exhausted: bool = True
        progress: Progress | None = None

    class ProducerFailed(_ProducerOp, role=MEMBER, answer=PRODUCERS_STATE):
        """Fail the queue with a status `code` and its `error` message."""
        code: int
        error: str

    class Producers(Request, answer=PRODUCERS_STATE):
        """The queue's producers and its end: closed (None, 'ok', 'failed'), error, each one's progress."""
        queue: int


class PsOps:
    """A parameter-server shard (services/ps/server.py). Tensors travel in the order of `names`;
    `bf16` sends float values as bfloat16 (half the bytes)."""

    class Init(Request, role=ADMIN, answer="version"):
        """Chief: the initial values of this shard's pieces, one tensor per name."""
        names: list[Name]
        step: int = 0
        force: bool = False

    class Restore(Request, role=ADMIN, answer="version path"):
        """Chief: load this shard's rows of the latest checkpoint in `dir` (or of `path`); the version is
        raised to `at_least` (the other shards' version)."""
        dir: Name
        path: str | None = None
        at_least: int | None = None

    class WaitReady(Request, answer="version"):
        """Parked until the shard is initialized."""

    class Pull(Request, role=MEMBER, answer="version released names layout"):
        """The shard's variables (or the pieces in `names`), one tensor per name; `newer_than`: no tensors
        when nothing changed; `min_version`: parked until the shard reaches it (sync). `packed`: one uint8
        tensor instead, holding them all, each at its `layout` entry's [dtype, shape, offset]."""
        bf16: bool = False
        min_version: int | None = None
        newer_than: int | None = None
        names: list[Name] | None = None
        packed: bool | None = None

    class Push(Request, role=MEMBER, answer="applied version released names layout"):
        """Gradients computed at `version`: one tensor per name, then (indices, rows) per piece in `sparse`.
        `pull`: the answer also carries every variable as it stands after this push, packed as a
        Pull(packed=True)'s (one round trip a step instead of a push and a pull); with `min_version`, as it
        stands once the shard reaches that version, parked as such a Pull is (a sync step's exchange)."""
        version: int
        names: list[Name]
        replica: int = 0
        sparse: list[Name] = ()
        bf16: bool = False
        pull: bool | None = None
        min_version: int | None = None

    class PushSparse(Request, role=MEMBER, answer="applied version"):
        """Gradient rows of piece `name`: tensors (indices, rows)."""
        name: Name
        version: int
        replica: int = 0

    class PullRows(Request, role=MEMBER, answer="version"):
        """Rows of piece `name`: tensor (indices); answered with the rows."""
        name: Name

    class Assign(Request, role=MEMBER, answer="assigned version"):
        """New values of non-trainable variables, one tensor per name, no optimizer."""
        names: list[Name]

    class Save(Request, role=MEMBER, answer="step"):
        """Write this shard's pieces into the staging directory of checkpoint `step` in `dir`."""
        dir: Name
        step: int | None = None
        metadata: dict[str, str] | None = None

    class Join(Request, role=MEMBER, answer="step version elastic"):
        """Replica `replica` counts in sync steps from `step` on (None: the shard picks the next step
        boundary); answered with that step at once: the replica then pulls with min_version=step."""
        replica: int = 0
        step: int | None = None

    class WorkerDone(Request, role=MEMBER, answer="done lost"):
        """Replica `replica` finished (`lost`: the chief gave up on a silent one); parked sync waits go."""
        replica: int = 0
        lost: bool = False

    class Stats(Request, answer="shard initialized version done_workers lost_workers shared_variables "
                                "shared_variable_bytes"):
        pass

    class Preload(Request, role=MEMBER, answer="rows names"):
        """Hold a data set ({component: array with rows}, one tensor per name) for workers to slice."""
        name: Name
        names: list[Name]

    class TakeRows(Request, role=MEMBER, answer="rows names"):
        """Rows of preloaded data `name`: tensor (indices); answered one tensor per component."""
        name: Name

    class Shutdown(Request, role=ADMIN, answer="version"):
        """The shard exits 0."""

    # shared variables: named by (container, name), held by the shard the placement names
    # (common/cluster/placement.py's shared_variable_shard); never the model's variables

    class CreateVariable(Request, role=MEMBER, answer="created dtype shape"):
        """A shared variable with the tensor as its initial value, unless it exists (then its value stays and
        `created` is false, as TF's initializer guarded by is_variable_initialized); one of another dtype or
        shape is INVALID_ARGUMENT."""
        name: Name
        container: str = ""

    class ReadVariable(Request, role=MEMBER, answer="dtype shape"):
        """Answered with the variable's value (NOT_FOUND when it does not exist)."""
        name: Name
        container: str = ""

    class AssignVariable(Request, role=MEMBER, answer="dtype shape"):
        """Tensor: the new value (the variable's dtype and shape); with `read_value`, answered with it."""
        name: Name
        container: str = ""
        read_value: bool = False

    class AssignAddVariable(Request, role=MEMBER, answer="dtype shape"):
        """Tensor: what to add (the variable's dtype and shape), atomically; with `read_value`, answered with
        the sum."""
        name: Name
        container: str = ""
        read_value: bool = False

    class ScatterAddVariable(Request, role=MEMBER, answer="dtype shape"):
        """Tensors (indices, updates): updates[i] added to row indices[i] (repeated rows add up), updates of
        shape indices.shape + the variable's row shape; with `read_value`, answered with the variable."""
        name: Name
        container: str = ""
        read_value: bool = False

    class ListVariables(Request, role=MEMBER, answer="variables"):
        """The shard's shared variables (of `container` when given): container, name, dtype, shape each."""
        container: str | None = None

    class Reset(Request, role=ADMIN, answer="container freed"):
        """Free every shared variable of a container (Session.reset); the model's variables are in none."""
        container: str = ""


class ServeOps:
    """A model server (services/serve/server.py, a worker in serve mode)."""

    class Predict(Request, answer="model version batch_rows predicted labels"):
        """Tensors: the model's inputs (in signature order, or named by `inputs`), or raw `records`
        {column: [values]}; answered with the outputs [n, width]."""
        inputs: list[str] | None = None
        records: dict | None = None

    class ModelInfo(Request, answer="schema"):
        """The model: its inputs, output and raw features."""


class ReplicaOps:
    """A replica of in-graph replication (services/worker/replica.py, a worker with `--in-graph`): it reads its
    own share of the input and computes on the ps's parameters when its one client (the graph's owner,
    services/worker/in_graph.py) asks."""

    class ComputeGradients(Request, role=MEMBER, answer="loss rows versions names"):
        """Sync: the gradients of the replica's next batch at the parameters of `min_version` (one per ps
        shard; pulled by the replica, parked until the shards reach it), one tensor per name, nothing
        pushed; OUT_OF_RANGE when its input has ended."""
        min_version: list[int] | None = None

    class RunStep(Request, role=MEMBER, answer="loss rows global_step"):
        """Async: one step of the replica's own (pull, compute on its next batch, push its gradients);
        OUT_OF_RANGE when its input has ended."""

    class Finish(Request, role=ADMIN, answer="steps examples seconds"):
        """The end (the client's, as the chief's): the replica settles its last push, says it is done to the ps
        and exits 0."""


AGGREGATOR_MODES = ("ensemble", "replica")
aggregator_mode = one_of(*AGGREGATOR_MODES)


class AggregatorOps:
    """An ensemble aggregator (services/aggregator/server.py)."""

    class Predict(Request, answer="answered missing latency_ms"):
        """A model server's predict, fanned out to the members and answered by `deadline_ms` with the
        combination of what arrived; `sent_at` (Unix s) tells how long it waited to be read."""
        inputs: list[str] | None = None
        records: dict | None = None
        deadline_ms: Positive | None = None
        min_members: Positive | None = None
        combine: Name | None = None
        mode: Annotated[str, aggregator_mode] | None = None
        sent_at: float | None = None

    class AddMember(Request, role=ADMIN, answer="member"):
        address: Name
        weight: float = 1.0

    class RemoveMember(Request, role=ADMIN, answer="member"):
        address: Name

    class Members(Request, answer="members"):
        """One entry per member: address, weight, health, counters."""

    class ModelInfo(Request, answer="schema"):
        """The members' model (a healthy member's model_info, relayed), so a client that reaches only the
        aggregator (a host in front of a compose or Kubernetes deployment) learns what it takes."""

    class Stats(Request, answer="members answers timeouts errors latency_ms"):
        pass


class EnsembleServeOps:
    """A model server hosting several checkpoints (`zmqflow serve --checkpoint A --checkpoint B ...`,
    services/serve/ensemble.py): the aggregator's predict, answered by combining the checkpoints in process,
    so an aggregator's client and a model server's both work; model_info as a model server's; members lists
    the checkpoints and their devices."""

    Predict = AggregatorOps.Predict
    ModelInfo = ServeOps.ModelInfo
    Members = AggregatorOps.Members


TABLES = {"every service": Ops, "queue-broker": BrokerOps, "ps-shard": PsOps, "serve": ServeOps,
          "aggregator": AggregatorOps, "ensemble serve": EnsembleServeOps, "in-graph replica": ReplicaOps}


def _roles_by_op():
    """{op name: role} over every table; an op name declared with two roles would make a client send the
    wrong credential, so it is refused here."""
    roles = {}
    for table in TABLES.values():
        for op, request in requests_of(table).items():
            if roles.setdefault(op, request.ROLE) != request.ROLE:
                raise ValueError(f"op {op!r} is declared with roles {roles[op]} and {request.ROLE}")
    return roles


ROLE_OF = _roles_by_op()
"""{op name: role}: a client sends an op's credential with it (common/rpc/calls.py)."""
ADMIN_OPS = frozenset(op for op, role in ROLE_OF.items() if role == ADMIN)
MEMBER_OPS = frozenset(op for op, role in ROLE_OF.items() if role == MEMBER)


def markdown():
    """docs/protocol.md: the op table of every service, from the declarations above."""
    lines = ["# The protocol's ops", "", "Generated from `common/wire/protocol.py` by `python -m zmqflow.common.wire.protocol`"
             " (tests/common/test_protocol.py fails when they differ). The header and the tensor frames are",
             "`common/wire/frames.py`'s; a request's `args` are the fields below, anything else is refused.", ""]
    for service, table in TABLES.items():
        lines += [f"## {service}", "", " ".join((table.__doc__ or "").split()), "",
                  "| op | role | args | answer | what |", "|---|---|---|---|---|"]
        for op, request in requests_of(table).items():
            args = "<br>".join(f"`{name}`: {check.words}" + ("" if default is _REQUIRED else f" = `{default!r}`")
                               for name, default, check in request._FIELDS)
            answer = ", ".join(f"`{a}`" for a in request.ANSWER)
            lines.append(f"| `{op}` | {request.ROLE} | {args} | {answer} | {request.WHAT} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
