"""string_input_producer: glob expansion, epochs, seeded per-epoch shuffle, and the queue it fills and closes."""

import itertools
import threading

import pytest

from zmqflow.common.errors import InvalidArgumentError, NotFoundError, OutOfRangeError
from zmqflow.services.reader.producer import epoch_file_names, expand_globs, filename_queue, string_input_producer

pytestmark = pytest.mark.unit


@pytest.fixture
def files(tmp_path):
    for name in ("b.csv", "a.csv", "c.csv", "notes.txt"):
        (tmp_path / name).write_text("1\n")
    (tmp_path / "sub.csv").mkdir()  # a directory matching the glob is not a file
    return tmp_path


def test_globs_expand_sorted_per_pattern_without_duplicates(files):
    got = expand_globs([str(files / "*.csv"), str(files / "notes.txt"), str(files / "a.csv")])
    assert [p.rsplit("/", 1)[1] for p in got] == ["a.csv", "b.csv", "c.csv", "notes.txt"]
    assert expand_globs(str(files / "b.csv")) == [str(files / "b.csv")]


def test_a_pattern_matching_nothing_is_not_found(files):
    with pytest.raises(NotFoundError, match="missing-"):
        expand_globs([str(files / "*.csv"), str(files / "missing-*.csv")])


def test_epochs_without_shuffle_cycle_in_order():
    assert list(epoch_file_names(["a", "b", "c"], num_epochs=2, shuffle=False)) == ["a", "b", "c"] * 2


def test_each_epoch_is_a_permutation_and_the_seed_fixes_the_sequence():
    files = [f"f{i}" for i in range(8)]
    names = list(epoch_file_names(files, num_epochs=3, shuffle=True, seed=7))
    epochs = [names[i:i + 8] for i in range(0, 24, 8)]
    assert all(sorted(e) == files for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # a fresh order every epoch
    assert names == list(epoch_file_names(files, num_epochs=3, shuffle=True, seed=7))
    assert names != list(epoch_file_names(files, num_epochs=3, shuffle=True, seed=8))


def test_forever_keeps_cycling_and_bad_arguments_are_refused():
    assert list(itertools.islice(epoch_file_names(["a", "b"], None, shuffle=False), 7)) == list("abababa")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            next(epoch_file_names(["a"], num_epochs=bad))
    with pytest.raises(InvalidArgumentError):
        next(epoch_file_names([], num_epochs=1))


@pytest.mark.service
def test_producer_pushes_every_epoch_then_closes(broker):
    files = ["x", "y", "z"]
    done = string_input_producer(files, broker, "names-closed", num_epochs=2, shuffle=True, seed=3, capacity=8)
    assert done.names == 6 and done.closed
    queue = filename_queue(broker, "names-closed", capacity=8)
    got = [n.decode() for n in queue.dequeue_up_to(10, timeout=5)]
    assert got == list(epoch_file_names(files, 2, True, 3))
    with pytest.raises(OutOfRangeError):
        queue.dequeue(timeout=5)


@pytest.mark.service
def test_producer_blocks_on_a_full_queue_and_stops_when_asked(broker):
    stop = threading.Event()
    result = {}
    thread = threading.Thread(target=lambda: result.update(done=string_input_producer(
        ["a", "b"], broker, "names-stopped", num_epochs=None, shuffle=False, capacity=3, stop=stop)))
    thread.start()
    queue = filename_queue(broker, "names-stopped", capacity=3)
    assert [n.decode() for n in queue.dequeue_many(5, timeout=10)] == list("ababa")
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert not result["done"].closed and not queue.is_closed()  # a stopped producer leaves the queue open


@pytest.mark.service
def test_producer_ends_when_someone_else_closes_its_queue(broker):
    queue = filename_queue(broker, "names-cancelled", capacity=1)
    result = {}
    thread = threading.Thread(target=lambda: result.update(done=string_input_producer(
        ["a"], broker, "names-cancelled", num_epochs=None, capacity=1)))
    thread.start()
    assert queue.dequeue(timeout=10) == b"a"
    queue.close(cancel_pending_enqueues=True)
    thread.join(10)
    assert not thread.is_alive() and not result["done"].closed
