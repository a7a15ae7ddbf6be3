"""The protocol's names: the wire version and every op each service answers.

Clients (common/*_client.py, common/queues.py) and services (services/*/server.py) both
spell ops through these constants, so an op is renamed in one place and a typo is an
AttributeError at import, not an INVALID_ARGUMENT at run time. Values are the strings on
the wire (common/wire.py's request header `op`).
"""

VERSION = 1
"""The `v` of every request and reply header; a service refuses any other."""


class Ops:
    """Answered by every service (common/rpc_service.py)."""

    PING = "ping"
    CANCEL = "cancel"
    BYE = "bye"
    INFO = "info"


class BrokerOps:
    """The queue-broker (services/broker/server.py)."""

    OPEN_QUEUE = "open_queue"
    ATTACH_QUEUE = "attach_queue"
    SIZE = "size"
    IS_CLOSED = "is_closed"
    RESET = "reset"
    LIST_QUEUES = "list_queues"
    SHUTDOWN = "shutdown"
    ENQUEUE = "enqueue"
    ENQUEUE_MANY = "enqueue_many"
    DEQUEUE = "dequeue"
    DEQUEUE_MANY = "dequeue_many"
    DEQUEUE_UP_TO = "dequeue_up_to"
    CLOSE = "close"
    QUEUE_OPS = (ENQUEUE, ENQUEUE_MANY, DEQUEUE, DEQUEUE_MANY, DEQUEUE_UP_TO, CLOSE)
    """The ops on one queue (a handle), served by the queue's own semantics."""
    ACK = "ack"
    NACK = "nack"
    EXTEND = "extend"
    LEASE_OPS = (ACK, NACK, EXTEND)
    """Settle or renew a lease a leased dequeue answered (services/broker/queues/leases.py)."""
    REGISTER_PRODUCER = "register_producer"
    BEAT = "beat"
    PRODUCER_DONE = "producer_done"
    PRODUCER_FAILED = "producer_failed"
    PRODUCERS = "producers"
    PRODUCER_OPS = (REGISTER_PRODUCER, BEAT, PRODUCER_DONE, PRODUCER_FAILED, PRODUCERS)
    """A queue's producers: register, beat within the lease, say done or failed; the broker closes or
    fails the queue (services/broker/queues/producers.py); `producers` shows their state."""
    ADMIN = frozenset({RESET, SHUTDOWN})
    """Need a credential (CURVE, or the admin token without it): they destroy queues or stop the broker."""


class PsOps:
    """A parameter-server shard (services/ps/server.py)."""

    INIT = "init"
    RESTORE = "restore"
    WAIT_READY = "wait_ready"
    PULL = "pull"
    PUSH = "push"
    PUSH_SPARSE = "push_sparse"
    PULL_ROWS = "pull_rows"
    ASSIGN = "assign"
    SAVE = "save"
    WORKER_DONE = "worker_done"
    STATS = "stats"
    PRELOAD = "preload"
    TAKE_ROWS = "take_rows"
    SHUTDOWN = "shutdown"
    ADMIN = frozenset({INIT, RESTORE, SHUTDOWN})
    """Need a credential (CURVE, or the admin token without it): they overwrite the variables or stop the shard."""


class ServeOps:
    """A model server (services/serve/server.py, a worker in serve mode)."""

    PREDICT = "predict"
    MODEL_INFO = "model_info"


class AggregatorOps:
    """An ensemble aggregator (services/aggregator/server.py)."""

    PREDICT = "predict"
    ADD_MEMBER = "add_member"
    REMOVE_MEMBER = "remove_member"
    MEMBERS = "members"
    STATS = "stats"
    ADMIN = frozenset({ADD_MEMBER, REMOVE_MEMBER})
    """Need a credential (CURVE, or the admin token without it): they change which models answer."""


ADMIN_OPS = BrokerOps.ADMIN | PsOps.ADMIN | AggregatorOps.ADMIN
"""Every admin op name: a client sends its admin token with these only (common/rpc_client.py)."""


def ops_of(namespace):
    """The op names a namespace class declares (for tests and `unknown op` messages)."""
    return {value for key, value in vars(namespace).items() if key.isupper() and isinstance(value, str)}
