"""TensorFlow's tf.train.batch and tf.train.shuffle_batch for the client library, over the broker.

    files = read_files("shards/*.csv", "csv", csv_options, num_epochs=2)
    with shuffle_batch(files, batch_size=100, capacity=2000, min_after_dequeue=1000, num_threads=2,
                       broker=endpoint, seed=1) as batches:
        for b in batches:                 # {"image": [100, 784], "label": [100]} until the input ends
            ...

As in TensorFlow, each is a queue (a FIFOQueue, a PaddingFIFOQueue with
`dynamic_pad`, a RandomShuffleQueue for shuffle_batch) filled by `num_threads`
threads, and a dequeue_many of `batch_size` (dequeue_up_to with
`allow_smaller_final_batch`). `get()` returns one batch and raises OutOfRangeError
once the input is exhausted; iterating stops there. The queue is closed by the
last thread to finish, so no instance is lost; an error in a thread closes it with
cancel and is raised by `get()`, as TF's coordinator re-raised a queue runner's.

The input is either
  read_files(...)  files read by the reader pipeline's threads (services/reader), num_epochs passes
                   (None: forever, as TF), file names shuffled per epoch; a dead or failing reader is
                   raised by get() (the broker fails the queue: docs/queue-semantics.md §8).
  an iterable      of instances, each a dict {name: value} or a tuple of values (of batches of them
                   with enqueue_many=True), shared by the threads; dtypes and shapes are taken from the
                   first item unless `shapes` is given.

The threads run in this process, so the data does pass through it: this is for a
client that reads its own input, as TF's in-graph producers did. Training jobs
use reader services (zmqflow reader), which keep data away from clients.
"""

import itertools
import os
import threading
import uuid
from typing import NamedTuple

import numpy as np

from zmqflow.common.errors import CancelledError, InvalidArgumentError, OutOfRangeError, check_int
from zmqflow.common.clients.queues import DEFAULT_BROKER_ENV, FIFOQueue, PaddingFIFOQueue, RandomShuffleQueue
from zmqflow.common.rpc.client import default_pool
from zmqflow.services.reader.producer import wait_or_cancel

ENQUEUE_MANY_TIMEOUT = 3600.0


class FileInput(NamedTuple):
    """Files to read with a format (see services/reader/formats), as the reader pipeline does."""

    patterns: list
    format_kind: str
    format_options: dict
    num_epochs: int | None
    shuffle: bool
    seed: int | None
    features: list | None
    cast: dict | None


def read_files(patterns, format_kind, format_options=None, num_epochs=None, shuffle=True, seed=None,
               features=None, cast=None):
    """An input of files: globs, their format and options, epochs (None: forever) and file shuffling."""
    patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    return FileInput(patterns, format_kind, dict(format_options or {}), num_epochs, shuffle, seed,
                     None if features is None else list(features), cast)


def batch(tensors, batch_size, num_threads=1, capacity=32, enqueue_many=False, shapes=None, dynamic_pad=False,
          allow_smaller_final_batch=False, shared_name=None, container="", broker=None, timeout=None):
    """tf.train.batch: a FIFO queue (padding with dynamic_pad) filled by threads, batches in order."""
    kind = "padding" if dynamic_pad else "fifo"
    return Batches(tensors, batch_size, kind, num_threads, capacity, None, None, enqueue_many, shapes,
                   allow_smaller_final_batch, shared_name, container, broker, timeout)


def shuffle_batch(tensors, batch_size, capacity, min_after_dequeue, num_threads=1, seed=None, enqueue_many=False,
                  shapes=None, allow_smaller_final_batch=False, shared_name=None, container="", broker=None,
                  timeout=None):
    """tf.train.shuffle_batch: a RandomShuffleQueue filled by threads, batches drawn at random."""
    return Batches(tensors, batch_size, "shuffle", num_threads, capacity, min_after_dequeue, seed, enqueue_many,
                   shapes, allow_smaller_final_batch, shared_name, container, broker, timeout)


class Batches:
    """The running producer: `get()` one batch, iterate, `close()` (or use `with`) to stop the threads."""

    def __init__(self, tensors, batch_size, kind, num_threads, capacity, min_after_dequeue, seed, enqueue_many,
                 shapes, allow_smaller_final_batch, shared_name, container, broker, timeout):
        check_int("batch_size", batch_size, 1)
        check_int("num_threads", num_threads, 1)
        self.broker = broker or os.environ.get(DEFAULT_BROKER_ENV)
        if not self.broker:
            raise InvalidArgumentError(f"no broker address: pass broker= or set {DEFAULT_BROKER_ENV}")
        self.batch_size, self.timeout = batch_size, timeout
        self.allow_smaller_final_batch = allow_smaller_final_batch
        self.name = shared_name or f"batch-{uuid.uuid4().hex[:12]}"
        self.container = container
        self._error = None
        self._pipeline = None
        self._threads = []
        self._stop = threading.Event()
        if isinstance(tensors, FileInput):
            self._start_files(tensors, kind, num_threads, capacity, min_after_dequeue, seed)
        else:
            self._start_iterable(tensors, kind, num_threads, capacity, min_after_dequeue, seed, enqueue_many, shapes)

    # ------------------------------------------------ the producing side

    def _start_files(self, source, kind, num_threads, capacity, min_after_dequeue, seed):
        from zmqflow.services.reader.reading import ReaderPipeline

        if source.num_epochs is not None and source.num_epochs < 1:
            raise InvalidArgumentError("num_epochs must be None or >= 1")
        self._pipeline = ReaderPipeline(
            self.broker, source.patterns, source.format_kind, source.format_options, queue=self.name,
            container=self.container, queue_kind=kind, capacity=capacity, min_after_dequeue=min_after_dequeue,
            seed=seed if seed is not None else source.seed, num_epochs=source.num_epochs,
            shuffle_files=source.shuffle, readers=num_threads, features=source.features, cast=source.cast,
            name="batch", progress_every=0)
        self._pipeline.start()
        self.queue = self._pipeline.instance_queue
        self._spawn(self._pipeline.wait)

    def _start_iterable(self, tensors, kind, num_threads, capacity, min_after_dequeue, seed, enqueue_many, shapes):
        items = iter(tensors)
        try:
            first = next(items)
        except StopIteration:
            raise InvalidArgumentError("the input is empty: nothing to batch") from None
        names = list(first) if isinstance(first, dict) else None
        values = [first[n] for n in names] if names else list(first) if isinstance(first, (list, tuple)) else [first]
        arrays = [np.asarray(v) for v in values]
        dtypes = ["string" if a.dtype.kind in "OSU" else a.dtype.name for a in arrays]
        if shapes is None:
            shapes = [list(a.shape[1:] if enqueue_many else a.shape) for a in arrays]
            if kind == "padding":
                shapes = [[None] * len(s) for s in shapes]
        common = dict(names=names, shared_name=self.name, container=self.container, broker=self.broker)
        if kind == "shuffle":
            self.queue = RandomShuffleQueue(capacity, min_after_dequeue, dtypes, shapes, seed=seed, **common)
        elif kind == "padding":
            self.queue = PaddingFIFOQueue(capacity, dtypes, shapes, **common)
        else:
            self.queue = FIFOQueue(capacity, dtypes, shapes, **common)
        self._items = itertools.chain([first], items)
        self._lock = threading.Lock()
        self._running = num_threads
        for _ in range(num_threads):
            self._spawn(self._enqueue_items, enqueue_many)

    def _spawn(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"{self.name}-producer")
        self._threads.append(thread)
        thread.start()

    def _enqueue_items(self, enqueue_many):
        try:
            while not self._stop.is_set():
                with self._lock:
                    item = next(self._items, None)
                if item is None:
                    break
                if enqueue_many:  # a timed-out enqueue_many may be partly in: no retry, its deadline is an error
                    self.queue.enqueue_many(item, timeout=ENQUEUE_MANY_TIMEOUT)
                else:
                    self._enqueue_one(item)
        except CancelledError:
            pass  # closed with cancel: close() or another thread's error
        except Exception as exc:  # noqa: BLE001 - a thread's error is raised by get(), as TF's coordinator did
            self._error = self._error or exc
            self._close_queue(cancel=True)
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._close_queue(cancel=self._stop.is_set())
            default_pool.close_thread()

    def _enqueue_one(self, item):
        """enqueue without a deadline, as TF's waits for room however long (a deadline retried took a live
        broker that answered one expiry late for a lost one); a stop cancels it (CancelledError, or its late
        success)."""
        if not self._stop.is_set():
            wait_or_cancel(self.queue.enqueue_async(item, timeout=None), self._stop)

    def _close_queue(self, cancel):
        try:
            self.queue.close(cancel_pending_enqueues=cancel, timeout=30.0)
        except CancelledError:
            pass  # already closed

    # ------------------------------------------------ the consuming side

    def get(self, timeout=None):
        """One batch (a dict by name, or a list of arrays); OutOfRangeError when the input is exhausted."""
        timeout = self.timeout if timeout is None else timeout
        try:
            if self.allow_smaller_final_batch:
                return self.queue.dequeue_up_to(self.batch_size, timeout=timeout)
            return self.queue.dequeue_many(self.batch_size, timeout=timeout)
        except OutOfRangeError:
            if self._error is not None:
                raise self._error from None
            raise

    def __iter__(self):
        while True:
            try:
                yield self.get()
            except OutOfRangeError:
                return

    def close(self, timeout=30.0):
        """Stop the threads (an unfinished input is abandoned) and close the queue with cancel."""
        self._stop.set()
        if self._pipeline is not None:
            self._pipeline.request_stop("closed by the consumer")
        else:
            self._close_queue(cancel=True)
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Batches", "FileInput", "batch", "read_files", "shuffle_batch"]
