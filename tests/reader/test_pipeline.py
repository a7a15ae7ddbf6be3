"""Reader threads in one process: every instance exactly once per epoch, shuffling, errors, padding, stops."""

import collections
import threading
import time

import numpy as np
import pytest

from zmqflow.common.errors import CancelledError, InvalidArgumentError, OutOfRangeError
from zmqflow.inputs.formats import write_tfrecord
from zmqflow.services.reader.reading import ReaderPipeline, queue_components
from tests.reader.conftest import ID_OPTIONS, MNIST_OPTIONS, write_shards

pytestmark = pytest.mark.service


def drain(watch, batch=250, limit_s=60):
    """Every batch until OutOfRange (raised errors propagate); bounded in time."""
    out, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            out.append(watch.dequeue_up_to(batch, timeout=20))
        except OutOfRangeError:
            return out
    raise AssertionError("the queue did not end in time")


class Running:
    """A ReaderPipeline run in a thread; joined (and stopped if need be) on exit."""

    def __init__(self, pipeline):
        self.pipeline, self.summary = pipeline, None
        pipeline.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.summary = self.pipeline.wait()

    def watch(self):
        """The instance queue, as consumers see it: the broker answers the pipeline's failure there."""
        return self.pipeline.instance_queue

    def join(self, timeout=20):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the reader pipeline did not finish"
        return self.summary

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.thread.is_alive():
            self.pipeline.request_stop("test over")
            self.thread.join(20)


def test_three_readers_eight_shards_two_epochs_every_instance_twice_then_out_of_range(broker, id_shards):
    pattern, rows = id_shards
    pipeline = ReaderPipeline(broker, [pattern], "csv", ID_OPTIONS, queue="e2e-threads", queue_kind="shuffle",
                              capacity=1500, min_after_dequeue=500, seed=5, num_epochs=2, readers=3, lease_s=2.0)
    with Running(pipeline) as run:
        batches = drain(run.watch())
        summary = run.join()
    ids = np.concatenate([b["id"] for b in batches])
    assert len(ids) == 2 * rows and set(collections.Counter(ids.tolist()).values()) == {2}
    labels = np.concatenate([b["label"] for b in batches])
    assert labels.dtype == np.int32 and batches[0]["image"].dtype == np.float32
    assert summary["outcome"] == "ok" and summary["files_done"] == 16 and summary["instances"] == 2 * rows
    assert summary["closed_by"] == summary["member"] and summary["names_pushed"] == 16
    assert summary["bytes_read"] > 0 and summary["malformed_skipped"] == 0


def test_shuffled_shards_and_a_shuffle_queue_mix_the_labels_of_a_sorted_file(broker, label_shards):
    """The MNIST CSV is sorted by label; cut into 200 one-label shards read in a shuffled order into a
    RandomShuffleQueue, the first mini-batches hold every digit in nearly equal shares."""
    pipeline = ReaderPipeline(broker, [label_shards], "csv", MNIST_OPTIONS, queue="mixed", queue_kind="shuffle",
                              capacity=3000, min_after_dequeue=2000, seed=1, num_epochs=1, readers=1,
                              features=["label"])
    with Running(pipeline) as run:
        watch = run.watch()
        first = np.concatenate([watch.dequeue_many(100, timeout=20)["label"] for _ in range(5)])
        rest = drain(watch)
        run.join()
    counts = np.bincount(first, minlength=10)
    assert (counts > 0).all(), counts  # all ten digits in the first 500 instances
    assert np.abs(counts / len(first) - 0.1).sum() / 2 < 0.2, counts  # total variation from uniform
    assert len(first) + sum(len(b["label"]) for b in rest) == 5000


def test_without_shuffling_the_first_batch_is_a_single_digit(broker, label_shards):
    pipeline = ReaderPipeline(broker, [label_shards], "csv", MNIST_OPTIONS, queue="sorted", queue_kind="fifo",
                              capacity=3000, num_epochs=1, shuffle_files=False, readers=1, features=["label"])
    with Running(pipeline) as run:
        first = run.watch().dequeue_many(100, timeout=20)["label"]
        run.pipeline.request_stop("enough")
    assert set(first.tolist()) == {0}


def test_a_malformed_line_fails_the_pipeline_and_the_consumer_sees_it(broker, tmp_path, mnist_lines):
    write_shards(tmp_path, mnist_lines[:300], 3)
    bad = tmp_path / "shard-01.csv"
    lines = bad.read_bytes().splitlines(keepends=True)
    lines[7] = b"1,2,3\n"
    bad.write_bytes(b"".join(lines))
    pipeline = ReaderPipeline(broker, [str(tmp_path / "*.csv")], "csv", MNIST_OPTIONS, queue="malformed",
                              queue_kind="fifo", capacity=1000, num_epochs=1, readers=2, lease_s=2.0)
    with Running(pipeline) as run:
        with pytest.raises(InvalidArgumentError, match=r"shard-01.csv:8: malformed CSV line"):
            drain(run.watch())
        summary = run.join()
    assert summary["outcome"] == "failed" and "shard-01.csv:8" in summary["error"]


def test_skip_bad_rows_counts_the_bad_line_and_delivers_the_rest(broker, tmp_path, mnist_lines):
    write_shards(tmp_path, mnist_lines[:300], 3)
    bad = tmp_path / "shard-02.csv"
    bad.write_bytes(bad.read_bytes() + b"1,x\n")
    options = {**MNIST_OPTIONS, "skip_bad_rows": True}
    pipeline = ReaderPipeline(broker, [str(tmp_path / "*.csv")], "csv", options, queue="skipped",
                              queue_kind="fifo", capacity=1000, num_epochs=1, readers=2)
    with Running(pipeline) as run:
        got = sum(len(b["label"]) for b in drain(run.watch()))
        summary = run.join()
    assert got == 300 and summary["malformed_skipped"] == 1 and summary["outcome"] == "ok"


def test_variable_length_features_go_through_a_padding_queue(broker, tmp_path):
    examples = [{"tokens": list(range(1, n + 1)), "label": n} for n in (1, 4, 2, 3)]
    write_tfrecord(tmp_path / "ragged.tfrecord", examples)
    options = {"features": {"tokens": {"dtype": "int64"}, "label": {"shape": [], "dtype": "int64"}}}
    pipeline = ReaderPipeline(broker, [str(tmp_path / "ragged.tfrecord")], "tfrecord", options, queue="ragged",
                              queue_kind="padding", capacity=10, num_epochs=1, shuffle_files=False)
    with Running(pipeline) as run:
        batch = run.watch().dequeue_many(4, timeout=10)
        run.join()
    assert batch["label"].tolist() == [1, 4, 2, 3]
    assert batch["tokens"].tolist() == [[1, 0, 0, 0], [1, 2, 3, 4], [1, 2, 0, 0], [1, 2, 3, 0]]
    with pytest.raises(InvalidArgumentError, match="padding"):
        ReaderPipeline(broker, [str(tmp_path / "ragged.tfrecord")], "tfrecord", options, queue="ragged-fifo",
                       queue_kind="fifo").start()


def test_a_stop_mid_file_fails_the_pipeline_with_cancelled(broker, id_shards):
    pattern, _ = id_shards
    pipeline = ReaderPipeline(broker, [pattern], "csv", ID_OPTIONS, queue="stopped", queue_kind="fifo",
                              capacity=100, num_epochs=1, readers=1, lease_s=2.0)
    with Running(pipeline) as run:
        watch = run.watch()
        watch.dequeue_many(50, timeout=10)  # the reader is blocked mid-file on a full queue
        run.pipeline.request_stop("SIGTERM")
        summary = run.join()
        with pytest.raises(CancelledError, match="stopped \\(SIGTERM\\) while reading .*shard-"):
            drain(watch)
    assert summary["outcome"] == "failed"


@pytest.mark.unit
def test_queue_components_select_and_cast_features():
    spec = {"label": ("uint8", ()), "image": ("float32", (784,))}
    assert queue_components(spec, ["image", "label"], {"label": "int32"}) == [
        ("image", "float32", [784]), ("label", "int32", [])]
    with pytest.raises(InvalidArgumentError, match="not in the format"):
        queue_components(spec, ["pixels"])
