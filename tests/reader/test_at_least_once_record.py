"""The close protocol's at-least-once mode: dead members dropped, no early close, orphaned pipelines, one mode."""

import time

import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.input_pipeline import Coordinator, PipelineRecord, PipelineRegister, PipelineWatch
from zmqflow.common.queues import FIFOQueue

pytestmark = pytest.mark.service


def joined(*members, at_least_once=True, lease_s=1.0):
    record = PipelineRecord()
    for m in members:
        assert record.join(m, {"lease_s": lease_s, "at_least_once": at_least_once, "rejoin_s": 5.0})
    return record


@pytest.mark.unit
def test_the_first_member_sets_the_mode_and_a_reader_of_the_other_mode_is_refused():
    record = joined("a")
    assert record.at_least_once and record.rejoin_s == 5.0
    with pytest.raises(InvalidArgumentError, match="reader b is not at-least-once, the pipeline's first reader was"):
        record.join("b", {"lease_s": 1.0})
    with pytest.raises(InvalidArgumentError, match="reader c is at-least-once"):
        joined("x", at_least_once=False).join("c", {"lease_s": 1.0, "at_least_once": True})


@pytest.mark.unit
def test_members_that_left_early_leave_the_pipeline_open_for_a_reader_to_join_again():
    record = joined("a", "b")
    assert record.finish("a", exhausted=False) is None and record.finish("b", exhausted=False) is None
    assert record.closed is None and record.orphaned()           # not failed: the names are still there
    assert record.join("c", {"lease_s": 1.0, "at_least_once": True}) and not record.orphaned()
    assert record.finish("c") == "close"                          # c saw the names exhausted
    assert joined("a", at_least_once=False).finish("a", exhausted=False) == "fail"   # the default mode fails


@pytest.mark.unit
def test_a_dropped_member_no_longer_holds_up_the_close():
    record = joined("a", "b")
    assert record.finish("a") is None                             # b is still reading
    record.drop("b")
    assert record.decision() == "close" and list(record.members) == ["a"]


@pytest.mark.unit
def test_a_member_dropped_as_dead_that_beats_again_is_a_member_again():
    record = joined("a", "b")
    record.drop("b")
    assert record.rejoin("b", {"lease_s": 1.0}) and not record.members["b"]["done"]
    assert not record.rejoin("b", {"lease_s": 1.0})                # already a member
    assert record.finish("a") is None                             # b holds the close up again
    record.mark_closed("a")
    record.drop("b")
    assert not record.rejoin("b", {"lease_s": 1.0})                # closed: nothing left to do


def test_a_dead_member_is_dropped_and_the_last_exhausted_one_left_closes(broker):
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="alo-drop", container="coord", broker=broker)
    names = FIFOQueue(10, ["string"], shapes=[[]], shared_name="alo-drop.filenames", container="coord", broker=broker)
    names.close()                                                  # the producer had pushed every name
    register = PipelineRegister(broker, "alo-drop", container="coord", token_wait_s=5)
    alive = Coordinator(register, queue, names, "reader@here:1", lease_s=0.3, at_least_once=True)
    dead = Coordinator(register, queue, names, "reader@gone:2", lease_s=0.3, at_least_once=True)
    assert alive.join() == "producer" and dead.join() == "reader"
    alive.finish()                                                 # exhausted; the dead one never finishes
    watch = PipelineWatch(queue, container="coord", poll_s=0.1)
    deadline = time.monotonic() + 5
    while register.read().closed is None and time.monotonic() < deadline:
        watch.check()                                              # the consumer finds it dead: dropped
        time.sleep(0.1)
    record = register.read()
    assert record.closed == "ok" and list(record.members) == ["reader@here:1"] and queue.is_closed()


def test_a_token_holder_that_dies_gives_the_token_back_at_once(broker):
    import subprocess
    import sys
    register = PipelineRegister(broker, "alo-token", container="coord", token_wait_s=2)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from zmqflow.common.input_pipeline import PipelineRegister\n"
        "register = PipelineRegister.find(sys.argv[1], 'alo-token', 'coord')\n"
        "register.update(lambda record: (print('holding', flush=True), time.sleep(60)))\n"), broker],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        holder.kill()
        holder.wait(5)
        started = time.monotonic()
        record = register.read()                                   # not lost: back when its holder died
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait(5)
    print(f"\nthe record's token came back {took * 1000:.0f} ms after its holder was SIGKILLed")
    assert record.closed is None and took < 2.0


def test_a_slow_member_dropped_as_dead_is_a_member_again_at_its_next_beat(broker):
    queue = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="alo-slow", container="coord", broker=broker)
    register = PipelineRegister(broker, "alo-slow", container="coord", token_wait_s=5)
    slow = Coordinator(register, queue, None, "reader@slow:1", lease_s=0.3, at_least_once=True)
    slow.join()
    register.update(lambda record: record.drop("reader@slow:1"))   # another participant took it for dead
    assert "reader@slow:1" not in register.read().members
    record = slow.beat({"instances": 5})
    assert record.members["reader@slow:1"]["progress"] == {"instances": 5} and record.members["reader@slow:1"]["pid"]
