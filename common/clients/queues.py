"""Queues on a broker, with TensorFlow 1.x's API: numpy in, numpy out.

    q = FIFOQueue(10, ["float32", "int32"], shapes=[[784], []], shared_name="mnist",
                  broker="tcp://127.0.0.1:5555")
    q.enqueue_many([images, labels])
    x, y = q.dequeue_many(100, timeout=5.0)

Each method blocks like its TensorFlow op; `timeout=` (seconds) becomes the
request's deadline, enforced by the broker (DeadlineExceededError, and nothing
is consumed after it). `*_async` methods return a future with `.result()` so
one thread can keep many requests in flight. A queue object may be used from
several threads: each thread talks to the broker over its own socket.

Every dequeue takes `lease=` (seconds) for at-least-once delivery: it then
returns a `Lease` (common/clients/leases.py) whose elements the broker keeps until
`ack()`, and gives back to the queue if this client dies or the lease expires.

`attach(name, role="producer", lease=...)` registers this process as one of the
queue's producers (common/clients/producers.py): the broker closes the queue when the last
one is done and fails it, for every consumer, when one vanishes mid-work.

A queue made without `container=` belongs to the enclosing `zmqflow.container(...)` scope's container
(common/clients/containers.py; "" outside every one), as TF's queues to tf.container's.
"""

import os

from zmqflow.common.wire import dtypes as wire_dtypes
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.clients.containers import current_container
from zmqflow.common.clients.leases import Lease
from zmqflow.common.rpc.client import USE_DEFAULT, default_pool
from zmqflow.common.wire.protocol import BrokerOps

DEFAULT_BROKER_ENV = "ZMQFLOW_BROKER"


def _dtype_name(dt):
    if isinstance(dt, str):
        return wire_dtypes.check_name(dt)
    import numpy as np
    if dt in (bytes, str, object):
        return wire_dtypes.STRING
    return wire_dtypes.name_of(np.empty(0, dtype=dt))


class QueueFuture:
    """A queue request in flight; `result()` returns what the blocking method would."""

    def __init__(self, pending, convert):
        self._pending, self._convert = pending, convert

    def result(self):
        return self._convert(*self._pending.result())

    def wait(self, timeout):
        """True once the answer is in (then `result()` does not block); waits up to `timeout` s."""
        return self._pending.wait(timeout)

    def cancel(self):
        self._pending.cancel()


class QueueBase:
    kind = None

    def __init__(self, capacity, dtypes, shapes=None, names=None, shared_name=None, container=None,
                 broker=None, pool=None, **extra):
        if not isinstance(dtypes, (list, tuple)):
            dtypes = [dtypes]
        if shapes is not None and (not shapes or not isinstance(shapes[0], (list, tuple))):
            shapes = [shapes]  # a single component's shape, as TF accepts
        self.broker = broker or os.environ.get(DEFAULT_BROKER_ENV)
        if not self.broker:
            raise InvalidArgumentError(f"no broker address: pass broker= or set {DEFAULT_BROKER_ENV}")
        self._pool = pool or default_pool
        declaration = {"kind": self.kind, "capacity": capacity, "dtypes": [_dtype_name(d) for d in dtypes],
                       "shapes": None if shapes is None else [list(s) for s in shapes],
                       "names": None if names is None else list(names), "shared_name": shared_name or "",
                       "container": current_container() if container is None else container, **extra}
        result = open_queue(declaration, self.broker, self._pool)
        self.handle = result["handle"]
        self.name = result.get("name", shared_name)
        self.dtypes = declaration["dtypes"]
        self.shapes = declaration["shapes"]
        self.names = declaration["names"]

    @property
    def _client(self):
        return self._pool.get(self.broker)

    # ------------------------------------------------ values in and out

    def _components(self, vals):
        if self.names is not None:
            if not isinstance(vals, dict):
                raise InvalidArgumentError("queue has names: enqueue a dict {name: value}")
            if set(vals) != set(self.names):
                raise InvalidArgumentError(f"keys {sorted(vals)} do not match the queue's names {self.names}")
            vals = [vals[n] for n in self.names]
        elif isinstance(vals, dict):
            raise InvalidArgumentError("queue has no names: enqueue a list or a tensor, not a dict")
        elif not isinstance(vals, (list, tuple)):
            vals = [vals]  # as TF: a list or tuple is the component list, anything else is one component
        if len(vals) != len(self.dtypes):
            raise InvalidArgumentError(f"expected {len(self.dtypes)} components, got {len(vals)}")
        return [wire_dtypes.to_array(v, d) for v, d in zip(vals, self.dtypes)]

    def _values(self, result, tensors):
        if self.names is not None:
            return dict(zip(self.names, tensors))
        return tensors[0] if len(tensors) == 1 else tensors

    def _submit(self, request, tensors, timeout, convert):
        return QueueFuture(self._client.submit(request, tensors=tensors, timeout=timeout), convert)

    def _dequeue(self, request, timeout):
        if request.lease is None:
            return self._submit(request, [], timeout, self._values)
        return self._submit(request, [], timeout,
                            lambda result, tensors: Lease(self, result, self._values(result, tensors)))

    # ------------------------------------------------ TensorFlow's methods

    def enqueue_async(self, vals, timeout=USE_DEFAULT):
        return self._submit(BrokerOps.Enqueue(self.handle), self._components(vals), timeout, _nothing)

    def enqueue_many_async(self, vals, timeout=USE_DEFAULT):
        return self._submit(BrokerOps.EnqueueMany(self.handle), self._components(vals), timeout, _nothing)

    def dequeue_async(self, timeout=USE_DEFAULT, lease=None):
        return self._dequeue(BrokerOps.Dequeue(self.handle, lease), timeout)

    def dequeue_many_async(self, n, timeout=USE_DEFAULT, lease=None):
        return self._dequeue(BrokerOps.DequeueMany(self.handle, n, lease), timeout)

    def dequeue_up_to_async(self, n, timeout=USE_DEFAULT, lease=None):
        return self._dequeue(BrokerOps.DequeueUpTo(self.handle, n, lease), timeout)

    def close_async(self, cancel_pending_enqueues=False, timeout=USE_DEFAULT):
        return self._submit(BrokerOps.Close(self.handle, bool(cancel_pending_enqueues)), [], timeout, _nothing)

    def enqueue(self, vals, timeout=USE_DEFAULT):
        return self.enqueue_async(vals, timeout).result()

    def enqueue_many(self, vals, timeout=USE_DEFAULT):
        return self.enqueue_many_async(vals, timeout).result()

    def dequeue(self, timeout=USE_DEFAULT, lease=None):
        """One element; with `lease=` seconds, a `Lease` holding it until acked (at least once)."""
        return self.dequeue_async(timeout, lease).result()

    def dequeue_many(self, n, timeout=USE_DEFAULT, lease=None):
        """n elements as a batch; with `lease=` seconds, a `Lease` holding them until acked."""
        return self.dequeue_many_async(n, timeout, lease).result()

    def dequeue_up_to(self, n, timeout=USE_DEFAULT, lease=None):
        """Up to n elements after close; with `lease=` seconds, a `Lease` holding them until acked."""
        return self.dequeue_up_to_async(n, timeout, lease).result()

    def close(self, cancel_pending_enqueues=False, timeout=USE_DEFAULT):
        return self.close_async(cancel_pending_enqueues, timeout).result()

    def size(self):
        return self._client.call(BrokerOps.Size(self.handle))[0]["size"]

    def is_closed(self):
        return self._client.call(BrokerOps.IsClosed(self.handle))[0]["closed"]

    def producers(self):
        """The broker's state of this queue's producers (common/clients/producers.py): closed None, 'ok' or
        'failed', closed_by, the error, and per producer done, exhausted, lease_s and progress."""
        return self._client.call(BrokerOps.Producers(self.handle))[0]


def open_queue(declaration, broker, pool=None, timeout=USE_DEFAULT):
    """Declare a queue on `broker`: the one of that shared name if it exists, else a new one.
    The broker's answer: handle, name and whether this call created it."""
    client = (pool or default_pool).get(broker)
    return client.call(BrokerOps.OpenQueue(declaration), timeout=timeout)[0]


def _nothing(result, tensors):
    return None


def attach(shared_name, container=None, broker=None, pool=None, timeout=30.0, role="consumer", lease=None, name=None):
    """The existing queue `shared_name` with the declaration its creator gave, waiting up to
    `timeout` seconds for it to be created (workers start before or after the reader). With
    role="producer" this process also registers as one of its producers (`queue.producer`, a
    common/producers.Producer named `name`, beating within `lease` seconds)."""
    if role not in ("consumer", "producer"):
        raise InvalidArgumentError(f"role must be 'consumer' or 'producer', got {role!r:.40}")
    import time
    from zmqflow.common.errors import NotFoundError
    broker = broker or os.environ.get(DEFAULT_BROKER_ENV)
    client = (pool or default_pool).get(broker)
    deadline = time.monotonic() + timeout
    container = current_container() if container is None else container
    while True:
        try:
            result, _ = client.call(BrokerOps.AttachQueue(shared_name, container), timeout=max(1.0, timeout))
            break
        except NotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    decl = result["declaration"]
    queue = object.__new__(_CLASSES[decl["kind"]])
    queue.broker, queue._pool, queue.handle, queue.name = broker, pool or default_pool, result["handle"], result["name"]
    queue.dtypes, queue.shapes, queue.names = decl["dtypes"], decl["shapes"], decl["names"]
    if role == "producer":
        from zmqflow.common.clients.producers import DEFAULT_LEASE_S, Producer
        queue.producer = Producer(queue, lease or DEFAULT_LEASE_S, name)
    return queue


class FIFOQueue(QueueBase):
    kind = "FIFOQueue"


class PaddingFIFOQueue(QueueBase):
    kind = "PaddingFIFOQueue"

    def __init__(self, capacity, dtypes, shapes, names=None, shared_name=None, container=None, broker=None, pool=None):
        super().__init__(capacity, dtypes, shapes, names, shared_name, container, broker, pool)


class RandomShuffleQueue(QueueBase):
    kind = "RandomShuffleQueue"

    def __init__(self, capacity, min_after_dequeue, dtypes, shapes=None, names=None, seed=None, shared_name=None,
                 container=None, broker=None, pool=None):
        super().__init__(capacity, dtypes, shapes, names, shared_name, container, broker, pool,
                         min_after_dequeue=min_after_dequeue, seed=seed)


_CLASSES = {cls.kind: cls for cls in (FIFOQueue, PaddingFIFOQueue, RandomShuffleQueue)}


def reset(containers, broker=None, pool=None):
    """Free every queue in `containers` (like Session.reset); pending requests fail Cancelled."""
    broker = broker or os.environ.get(DEFAULT_BROKER_ENV)
    client = (pool or default_pool).get(broker)
    return [client.call(BrokerOps.Reset(c))[0] for c in ([containers] if isinstance(containers, str) else containers)]
