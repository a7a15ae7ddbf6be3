"""QueueRegistry against docs/queue-semantics.md §1, §7: identity, attach, NotFound, container reset."""

import numpy as np
import pytest

from zmqflow.common.errors import CancelledError, InvalidArgumentError, NotFoundError
from zmqflow.services.broker.queues import QueueDeclaration, QueueRegistry, Ticket
from zmqflow.common.wire.protocol import BrokerOps

pytestmark = pytest.mark.unit


def decl(shared_name="", container="", kind="FIFOQueue", capacity=10, shapes=([],), **kw):
    return QueueDeclaration(kind, capacity, ["int32"], [list(s) for s in shapes], shared_name=shared_name,
                            container=container, **kw)


def submit(queue, op, *components, **kw):
    t = Ticket(op, list(components), **kw)
    queue.submit(t)
    return t


def test_open_creates_then_attaches_by_shared_name():
    r = QueueRegistry()
    h, created = r.open(decl("q"))
    assert created and r.get(h).name == "q"
    assert r.open(decl("q")) == (h, False)


def test_private_queues_are_always_new():
    r = QueueRegistry()
    a, b = r.open(decl())[0], r.open(decl())[0]
    assert a != b and r.get(a) is not r.get(b) and r.get(a).name != r.get(b).name


def test_same_shared_name_in_different_containers_names_different_queues():
    r = QueueRegistry()
    assert r.open(decl("q", "a"))[0] != r.open(decl("q", "b"))[0]


def test_incompatible_attach_is_invalid_and_leaves_the_existing_queue_untouched():
    r = QueueRegistry()
    h, _ = r.open(decl("q"))
    submit(r.get(h), "enqueue", np.array(1, np.int32))
    before = r.get(h).describe()
    with pytest.raises(InvalidArgumentError, match="capacity"):
        r.open(decl("q", capacity=15))
    with pytest.raises(InvalidArgumentError, match="expected FIFOQueue"):
        r.open(decl("q", kind="PaddingFIFOQueue"))
    assert r.get(h).describe() == before and len(r.list()) == 1


def test_open_validates_the_declaration():
    with pytest.raises(InvalidArgumentError):
        QueueRegistry().open(decl("q", shapes=([None],)))


def test_get_unknown_handle_is_not_found_naming_it():
    r = QueueRegistry()
    with pytest.raises(NotFoundError, match="queue 7 not found: never created or its container was reset"):
        r.get(7)
    with pytest.raises(InvalidArgumentError):   # a handle that is no int: refused on the wire, by the declaration
        BrokerOps.Size.validate({"queue": "7"})


def test_reset_cancels_pending_requests_frees_queues_and_reopen_makes_a_new_queue():
    r = QueueRegistry()
    h, _ = r.open(decl("q", "c"))
    other, _ = r.open(decl("q", "d"))
    private, _ = r.open(decl("", "c"))
    waiting = submit(r.get(h), "dequeue")
    submit(r.get(private), "enqueue", np.array(1, np.int32))
    done = r.reset("c")
    assert done == [waiting] and isinstance(waiting.error, CancelledError)
    for gone in (h, private):
        with pytest.raises(NotFoundError):
            r.get(gone)
    assert r.get(other).size() == 0  # another container is untouched
    again, created = r.open(decl("q", "c"))
    assert created and again not in (h, other, private) and r.get(again).size() == 0


def test_reset_of_an_unknown_container_does_nothing():
    r = QueueRegistry()
    r.open(decl("q"))
    assert r.reset("nope") == [] and len(r.list()) == 1


def test_handles_are_never_reused():
    r = QueueRegistry()
    seen = set()
    for _ in range(5):
        h, _ = r.open(decl("q", "c"))
        assert h not in seen
        seen.add(h)
        r.reset("c")


def test_cancel_owner_across_queues():
    r = QueueRegistry()
    a, b = (r.get(r.open(decl(name))[0]) for name in ("a", "b"))
    submit(a, "enqueue", np.array(5, np.int32))
    mine = [submit(a, "dequeue_many", n=2, owner="me"), submit(b, "dequeue", owner="me")]
    theirs = submit(b, "dequeue", owner="you")
    err = CancelledError("client went away")
    assert r.cancel_owner("me", err) == mine and all(t.error is err for t in mine)
    assert theirs.pending and a.size() == 1  # the absorbed element came back


def test_list_describes_every_queue():
    r = QueueRegistry()
    h, _ = r.open(decl("q", "c", kind="RandomShuffleQueue", min_after_dequeue=2))
    submit(r.get(h), "dequeue")
    [row] = r.list()
    assert row["handle"] == h and row["container"] == "c" and row["shared_name"] == "q"
    assert row["kind"] == "RandomShuffleQueue" and row["min_after_dequeue"] == 2 and row["waiting_dequeues"] == 1
    assert row["size"] == 0 and row["closed"] is False and row["capacity"] == 10
