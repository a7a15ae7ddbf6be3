"""The close protocol: the record's rules as plain code, and its token on a real broker."""

import threading

import pytest

from zmqflow.common.errors import ABORTED, AbortedError, DataLossError, OutOfRangeError
from zmqflow.common.queues import FIFOQueue
from zmqflow.common.input_pipeline import (Coordinator, LeaseWatch, PipelineRecord, PipelineRegister, PipelineWatch,
                                          raise_if_failed)

pytestmark = pytest.mark.service


def joined(*members, lease_s=1.0):
    record = PipelineRecord()
    for m in members:
        assert record.join(m, {"lease_s": lease_s})
    return record


@pytest.mark.unit
def test_the_first_member_produces_and_only_the_last_to_finish_closes():
    record = joined("a", "b", "c")
    assert record.producer == "a"
    assert record.finish("b") is None and record.finish("a") is None
    assert record.finish("c") == "close"  # every member done, pipeline open: c closes
    record.mark_closed("c")
    assert record.closed == "ok" and record.doc["closed_by"] == "c"
    assert record.finish("c") is None  # closing is decided once


@pytest.mark.unit
def test_a_member_joining_after_the_close_does_nothing_and_one_joining_before_is_waited_for():
    record = joined("a")
    assert record.join("late-but-before", {"lease_s": 1.0})
    assert record.finish("a") is None  # the second member may still push
    assert record.finish("late-but-before") == "close"
    record.mark_closed("late-but-before")
    assert not record.join("after", {"lease_s": 1.0}) and "after" not in record.members


@pytest.mark.unit
def test_members_that_left_early_close_nothing_unless_one_saw_the_end():
    record = joined("a", "b")
    assert record.finish("a", exhausted=False) is None
    assert record.finish("b", exhausted=False) == "fail"  # nobody saw the end: input would be lost
    record = joined("a", "b")
    assert record.finish("a", exhausted=False) is None  # stopped between files: b takes the rest
    assert record.finish("b") == "close"


@pytest.mark.unit
def test_a_failure_is_recorded_once_and_raised_to_whoever_joins():
    record = joined("a", "b")
    assert record.fail("b", 15, "shard-3.csv: corrupted record at offset 10")
    assert not record.fail("a", ABORTED, "later")  # the first failure stays
    assert record.finish("a") is None  # finishing a failed pipeline closes nothing
    assert isinstance(record.error(), DataLossError) and "shard-3" in str(record.error())
    with pytest.raises(DataLossError):
        record.join("c", {"lease_s": 1.0})
    assert PipelineRecord.decode(record.encode()).doc == record.doc


@pytest.mark.unit
def test_a_member_is_dead_when_its_beat_stands_still_past_its_lease_by_the_watchers_clock():
    now = [100.0]
    watch = LeaseWatch(clock=lambda: now[0])
    record = joined("a", "b", lease_s=2.0)
    assert watch.dead(record, me="a") == []  # first sight starts the clock
    now[0] += 1.5
    record.beat("b")
    assert watch.dead(record, me="a") == []  # b beat: its clock restarts
    now[0] += 1.9
    assert watch.dead(record, me="a") == []
    now[0] += 0.2
    assert watch.dead(record, me="a") == [("b", pytest.approx(2.1))]
    record.finish("b")
    assert watch.dead(record, me="a") == []  # a finished member needs no beat


def test_one_token_however_many_open_the_record_at_once(broker):
    registers, errors = [], []

    def open_register():
        try:
            registers.append(PipelineRegister(broker, "race", container="coord", token_wait_s=5))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=open_register) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors and len(registers) == 6
    assert registers[0].queue.size() == 1  # exactly one record, put in by the creator


def test_updates_are_mutually_exclusive(broker):
    register = PipelineRegister(broker, "exclusive", container="coord", token_wait_s=5)
    register.update(lambda r: r.doc.update(count=0))

    def bump(record):
        value = record.doc["count"]
        threading.Event().wait(0.001)  # widen the window a lost update would need
        record.doc["count"] = value + 1

    def worker():
        for _ in range(20):
            register.update(bump)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert register.read().doc["count"] == 80


def test_a_lost_token_is_an_aborted_pipeline_not_a_hang(broker):
    register = PipelineRegister(broker, "lost", container="coord", token_wait_s=0.3)
    register.queue.dequeue(timeout=5)  # a participant "dies" holding the token
    with pytest.raises(AbortedError, match="record lost|not handed back"):
        register.read()


def test_a_consumer_fails_a_pipeline_whose_only_member_stopped_beating(broker):
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="orphaned", container="coord", broker=broker)
    register = PipelineRegister(broker, "orphaned", container="coord", token_wait_s=5)
    member = Coordinator(register, queue, None, "reader@gone:1", lease_s=0.3)
    assert member.join() == "producer"
    queue.enqueue_many([[1, 2, 3]])
    watch = PipelineWatch(queue, container="coord", poll_s=0.1)
    assert watch.dequeue_up_to(3, timeout=5).tolist() == [1, 2, 3]
    with pytest.raises(AbortedError, match=r"reader@gone:1 stopped beating"):
        watch.dequeue(timeout=10)  # nobody beats: the consumer's own watch finds the member dead
    assert queue.is_closed()
    with pytest.raises(AbortedError):
        raise_if_failed(queue, container="coord")


def test_raise_if_failed_is_quiet_without_a_pipeline_or_after_a_good_close(broker):
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="plain", container="coord", broker=broker)
    raise_if_failed(queue, container="coord")
    register = PipelineRegister(broker, "plain", container="coord", token_wait_s=5)
    member = Coordinator(register, queue, None, "reader@here:1")
    member.join()
    assert member.finish().closed == "ok"
    with pytest.raises(OutOfRangeError):
        PipelineWatch(queue, container="coord").dequeue(timeout=5)
