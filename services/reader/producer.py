"""The file-name producer: TensorFlow's string_input_producer, over the broker's FIFO queues.

    names = expand_globs(["data/train-*.csv", "extra.csv"])
    string_input_producer(names, broker, "train.filenames", num_epochs=2, shuffle=True, seed=7)

Expands globs (sorted, each pattern must match something), cycles through the
files once per epoch for `num_epochs` epochs (None: forever), shuffles them per
epoch when asked (seeded: the same seed gives the same sequence of epochs),
pushes the names into a FIFO queue of strings and closes it when the last epoch
is in, so readers end on OutOfRange exactly when every name was handed out.

Any client of the broker can enqueue into a file-name queue too, so a reader takes
a name from it only as a pointer into its own list (`ReaderFiles`: its globs,
expanded once at start) and refuses any other (docs/security.md).

The epoch order (`epoch_file_names`) is plain code; only `string_input_producer`
talks to the broker. Names are pushed one `enqueue` at a time, without a deadline:
as TF's enqueue, it waits for room however long the queue stays full (the readers
are behind a slow consumer), and only the broker's answer ends it, or the client's
heartbeats finding the broker gone (UnavailableError). A short deadline retried
instead made a live broker that answered one expiry a second late (a busy machine
starving it) look lost: the client gives up a call past its deadline and grace
as UnavailableError (issue 26: a reader exited 3 after minutes of a full queue).
A stop cancels the request in flight and takes its answer, a late success included
(`wait_or_cancel`).
"""

import glob
import itertools
import logging
import os
import threading
from typing import NamedTuple

import numpy as np

from zmqflow.common.errors import CancelledError, InvalidArgumentError, NotFoundError, PermissionDeniedError, check_int
from zmqflow.common.clients.queues import FIFOQueue

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 32  # TF's string_input_producer default
POLL_S = 1.0
"""Seconds between two looks at a stop while a queue request waits for the broker."""


class Produced(NamedTuple):
    """What a producer run did: `names` pushed, and whether it closed the queue (it finished)."""

    names: int
    closed: bool


def expand_globs(patterns):
    """Every file matched by `patterns` (a string or a list), each pattern's matches sorted,
    duplicates dropped in first-seen order. A pattern that matches nothing is NotFound, as
    TF's string_input_producer refuses an empty list; a plain path that exists is kept as is."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    files, seen = [], set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not matches:
            raise NotFoundError(f"no file matches {pattern!r}")
        for path in matches:
            if path not in seen:
                seen.add(path)
                files.append(path)
    return files


class ReaderFiles:
    """The files one reader process may open: its file list (globs expanded at start), each resolved once.

    Any broker client can enqueue into a pipeline's file-name queue, so a name taken from it is read only
    when it resolves (realpath, now) to a file of this list, and the path opened is the list's own. Any
    other name, a path outside the globs, `../` out of them, a symlink made or retargeted after the start,
    is refused with PermissionDenied naming it. A symlink the globs matched at start is followed: the
    operator's glob named it. Names, not indexes, stay in the queue, as string_input_producer's."""

    def __init__(self, paths):
        self.paths = list(paths)
        self._by_realpath = {}
        for path in self.paths:
            self._by_realpath.setdefault(os.path.realpath(path), path)

    def __len__(self):
        return len(self.paths)

    def resolve(self, name, source):
        """This list's path for `name` (bytes, as dequeued from the queue `source`), or PermissionDenied."""
        text = os.fsdecode(name)
        try:
            path = self._by_realpath.get(os.path.realpath(text))
        except ValueError:   # an embedded NUL byte: no file has that name
            path = None
        if path is None:
            shown_name = repr(text[:512]) + ("..." if len(text) > 512 else "")
            raise PermissionDeniedError(f"file name {shown_name} from {source!r} is not one of the {len(self)} files "
                                        "this reader was given (its file list, expanded at start): refused, "
                                        "nothing read (docs/security.md)")
        return path


def epoch_file_names(files, num_epochs=None, shuffle=True, seed=None):
    """The names in the order readers get them: `num_epochs` passes (None: forever), each
    a fresh permutation when `shuffle` (numpy's generator seeded once with `seed`)."""
    files = list(files)
    if not files:
        raise InvalidArgumentError("string_input_producer needs at least one file name")
    check_int("num_epochs", num_epochs, 1, optional=True)
    rng = np.random.default_rng(seed)
    epochs = itertools.count() if num_epochs is None else range(num_epochs)
    for _ in epochs:
        order = rng.permutation(len(files)) if shuffle else range(len(files))
        for i in order:
            yield files[i]


def filename_queue(broker, shared_name, container="", capacity=DEFAULT_CAPACITY, pool=None):
    """The FIFO queue of file names (one string per element), created or attached."""
    return FIFOQueue(capacity, ["string"], shapes=[[]], shared_name=shared_name, container=container,
                     broker=broker, pool=pool)


def wait_or_cancel(future, stop, poll_s=POLL_S):
    """(the answer of `future`, whether `stop` came first): `future` a queue request sent without a deadline,
    waited for as long as the broker holds it (its heartbeats still end the wait, UnavailableError, when the
    broker is gone); `stop` (a threading.Event) set meanwhile cancels it, and its answer is still taken, a late
    success included, so nothing it took or put is lost unseen. Raises the request's error (CancelledError
    for one this cancelled)."""
    stopped = False
    while not future.wait(poll_s):
        if stop.is_set():
            future.cancel()
            stopped = True
            break
    return future.result(), stopped


def string_input_producer(files, broker, shared_name, container="", num_epochs=None, shuffle=True, seed=None,
                          capacity=DEFAULT_CAPACITY, stop=None, pool=None):
    """Push the names of `num_epochs` epochs into the queue `shared_name`, then close it.

    Returns Produced(names pushed, closed). Stops early, without closing, when `stop`
    (a threading.Event) is set or when someone else closed the queue (a failed
    pipeline closes it with cancel): the caller decides what an unfinished
    producer means. A full queue is waited out however long; a stop is seen within POLL_S.
    """
    stop = stop or threading.Event()
    queue = filename_queue(broker, shared_name, container, capacity, pool)
    pushed = 0
    for name in epoch_file_names(files, num_epochs, shuffle, seed):
        if stop.is_set():
            return Produced(pushed, False)
        try:
            _, stopped = wait_or_cancel(queue.enqueue_async(os.fspath(name).encode(), timeout=None), stop)
        except CancelledError:
            if not stop.is_set():
                log.info("file-name queue %r was closed by someone else after %d names", shared_name, pushed)
            return Produced(pushed, False)
        pushed += 1
        if stopped:
            return Produced(pushed, False)
    try:
        queue.close(timeout=30.0)
    except CancelledError:  # closed meanwhile by a failing pipeline
        return Produced(pushed, False)
    log.info("file-name queue %r: %d names pushed (%s epochs), closed", shared_name, pushed, num_epochs)
    return Produced(pushed, True)
