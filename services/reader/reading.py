"""Readers: the threads of one reader process take file names and push their instances into the instance queue.

    pipeline = ReaderPipeline(broker, ["shards/train-*.csv"], "csv", csv_options, queue="train",
                              queue_kind="shuffle", capacity=10_000, min_after_dequeue=5_000,
                              num_epochs=2, readers=3)
    summary = pipeline.run()   # returns when the instance queue is closed, or the pipeline failed

One process is one producer of the instance queue on the broker (common/clients/producers.py):
it registers, beats while it works, and says done when its readers are done; the broker
closes the instance queue when the last producer is done, and fails it (every consumer gets
the error) when one vanishes mid-file or reports an error. The first producer to register
also runs the file-name producer (producer.py); every process should be given the same
files and epochs, as a reader opens only the files of its own list and fails the pipeline
(PermissionDenied) on any other name (ReaderFiles; docs/security.md).

Each of the `readers` threads dequeues a file name, reads the file chunk by chunk
with its own format object (formats/) and pushes each chunk with one
enqueue_many, keeping up to `in_flight` pushes outstanding while it parses the
next chunk, so the round trips overlap parsing (order is kept: one socket per
thread, served in arrival order). Threads, as TF's queue runners, because a process
is the unit of failure and of registration; parsing holds the GIL, so to
use more cores run more reader processes on the same queue (jobs/local_cluster.py's
`start_readers`). Features with a ragged (None) dimension go to a PaddingFIFOQueue one
instance per enqueue, as one enqueue_many holds instances of one shape only.

Waits: file names are taken without a deadline, as TF's dequeue (the broker's answer or
the client's heartbeats finding it gone end the wait, a stop cancels it: producer.py's
`wait_or_cancel`), so a live broker slow to answer is never taken for a lost one; a push
waits at most `enqueue_timeout` for room, after which the pipeline fails
(a timed-out enqueue_many may have inserted part of its chunk, so it cannot be
retried without duplicates). A stop (SIGTERM) between files leaves cleanly; a stop
mid-file fails the pipeline with CancelledError naming the file, as TF's
coordinator closed the queues with cancel on request_stop.

With `at_least_once`, each file name is taken with a lease of `lease_s`, extended by the
reading thread while it works on the file, and acked once the file's last enqueue_many
was acknowledged: a reader killed mid-file gives its name back and the file is read
again by another (or a restarted) reader; a stop mid-file nacks the name instead of
failing the pipeline (docs/queue-semantics.md §8, docs/queues.md).
"""

import collections
import logging
import threading
import time

import numpy as np

from zmqflow.common.errors import (CancelledError, DeadlineExceededError, InternalError, InvalidArgumentError, OpError,
                           OutOfRangeError, PermissionDeniedError, UnavailableError, check_int)
from zmqflow.common.clients.producers import CALL_TIMEOUT, DEFAULT_LEASE_S, DEFAULT_REJOIN_S, Producer, producer_name
from zmqflow.common.clients.queues import FIFOQueue, PaddingFIFOQueue, RandomShuffleQueue
from zmqflow.common.rpc.client import default_pool
from zmqflow.inputs.formats import open_format
from zmqflow.inputs.spec_stream import SpecStream
from zmqflow.services.reader.producer import (DEFAULT_CAPACITY, ReaderFiles, expand_globs, filename_queue,
                                              string_input_producer, wait_or_cancel)

log = logging.getLogger("reader")

QUEUE_KINDS = ("shuffle", "fifo", "padding")
DATA_SPEC = SpecStream.kind  # the format kind of `--data-config`: a data spec's prepared rows
POLL_S = 1.0
DEFAULT_ENQUEUE_TIMEOUT = 3600.0
FILENAMES_SUFFIX = ".filenames"


def queue_components(spec, features=None, cast=None):
    """[(name, dtype, shape)] of the instance queue: the chosen features of a format's spec, after casts."""
    cast = dict(cast or {})
    names = list(spec) if features is None else list(features)
    unknown = [n for n in list(names) + list(cast) if n not in spec]
    if unknown:
        raise InvalidArgumentError(f"features {unknown} are not in the format's spec {sorted(spec)}")
    if not names:
        raise InvalidArgumentError("no feature to enqueue")
    components = []
    for name in names:
        dtype, shape = spec[name]
        if name in cast:
            if dtype == "string" or cast[name] == "string":
                raise InvalidArgumentError(f"feature {name!r}: cannot cast between string and numbers")
            dtype = np.dtype(cast[name]).name
        components.append((name, dtype, list(shape)))
    return components


def open_reader_format(kind, options):
    """A reader thread's format object: one of inputs/formats, or a data spec's stream (DATA_SPEC)."""
    return SpecStream(**options) if kind == DATA_SPEC else open_format(kind, **options)


def open_instance_queue(broker, shared_name, components, kind="shuffle", capacity=10_000, min_after_dequeue=None,
                        seed=None, container="", pool=None):
    """Create or attach to the instance queue declared from `components` (queue_components)."""
    if kind not in QUEUE_KINDS:
        raise InvalidArgumentError(f"queue kind {kind!r}: expected one of {', '.join(QUEUE_KINDS)}")
    names = [n for n, _, _ in components]
    dtypes = [d for _, d, _ in components]
    shapes = [s for _, _, s in components]
    ragged = [n for n, _, s in components if None in s]
    if ragged and kind != "padding":
        raise InvalidArgumentError(f"features {ragged} have a variable length: use the padding queue kind")
    common = dict(names=names, shared_name=shared_name, container=container, broker=broker, pool=pool)
    if kind == "shuffle":
        if min_after_dequeue is None:
            min_after_dequeue = capacity // 2
        return RandomShuffleQueue(capacity, min_after_dequeue, dtypes, shapes, seed=seed, **common)
    if kind == "padding":
        return PaddingFIFOQueue(capacity, dtypes, shapes, **common)
    return FIFOQueue(capacity, dtypes, shapes, **common)


class ReaderCounters:
    """What the readers of one process did; safe to update from several threads."""

    def __init__(self, readers):
        self._lock = threading.Lock()
        self.instances = self.files_done = 0
        self.reading = [None] * readers  # the file each reader thread is in, or None
        self.formats = [None] * readers
        self.started = time.monotonic()

    def pushed(self, count):
        with self._lock:
            self.instances += count

    def file_done(self):
        with self._lock:
            self.files_done += 1

    def snapshot(self):
        """A JSON-able dict: instances, instances_per_s, files_done, bytes_read, malformed_skipped, reading."""
        fmt = [f.counters for f in self.formats if f is not None]
        elapsed = max(1e-9, time.monotonic() - self.started)
        return {"instances": self.instances, "instances_per_s": round(self.instances / elapsed, 1),
                "files_done": self.files_done, "bytes_read": sum(c.bytes_read for c in fmt),
                "records_read": sum(c.records_read for c in fmt),
                "malformed_skipped": sum(c.malformed_skipped for c in fmt),
                "reading": [p for p in self.reading if p], "seconds": round(elapsed, 3)}

    def metric_families(self, member):
        """This reader process's counters for Prometheus, read at scrape time (common/processes/metrics.py)."""
        from zmqflow.common.processes.metrics import counter_family, gauge_family
        snap, key = self.snapshot(), (member,)
        for field, name, doc in (("instances", "instances", "Instances pushed into the instance queue."),
                                 ("files_done", "files_done", "Files read."), ("records_read", "records_read",
                                                                                "Records read."),
                                 ("bytes_read", "read_bytes", "Bytes read from files."),
                                 ("malformed_skipped", "malformed_skipped", "Malformed records skipped.")):
            yield counter_family(f"zmqflow_reader_{name}", doc, {key: snap[field]}, ["member"])
        yield gauge_family("zmqflow_reader_files_reading", "Files being read now.", {key: len(snap["reading"])},
                           ["member"])


class ReaderPipeline:
    """One reader process's part of a pipeline: its reader threads, the file-name producer if it is the
    first producer, its beats."""

    def __init__(self, broker, files, format_kind, format_options=None, *, queue="train", container="",
                 queue_kind="shuffle", capacity=10_000, min_after_dequeue=None, seed=None, num_epochs=1,
                 shuffle_files=True, readers=1, features=None, cast=None, filename_capacity=DEFAULT_CAPACITY,
                 lease_s=DEFAULT_LEASE_S, enqueue_timeout=DEFAULT_ENQUEUE_TIMEOUT, in_flight=2, name="reader",
                 progress_every=10.0, pool=None, at_least_once=False, rejoin_s=DEFAULT_REJOIN_S):
        check_int("readers", readers, 1)
        check_int("in_flight", in_flight, 1)
        self.broker, self.queue_name, self.container = broker, queue, container
        self.format_kind, self.format_options = format_kind, dict(format_options or {})
        spec = open_reader_format(format_kind, self.format_options).spec  # bad options fail here, before registering
        self.components = queue_components(spec, features, cast)
        self.cast = {n: np.dtype(d) for n, d in (cast or {}).items()}
        self.ragged = any(None in s for _, _, s in self.components)
        self.queue_options = dict(kind=queue_kind, capacity=capacity, min_after_dequeue=min_after_dequeue, seed=seed)
        self.files = ReaderFiles(expand_globs(files) if files else [])   # the only files its threads open
        self.num_epochs, self.shuffle_files, self.seed = num_epochs, shuffle_files, seed
        self.readers, self.filename_capacity = readers, filename_capacity
        self.at_least_once, self.rejoin_s = at_least_once, rejoin_s
        if at_least_once and num_epochs:   # every name fits: the producer is done at once (its death would fail)
            self.filename_capacity = max(filename_capacity, len(self.files) * num_epochs)
        self.lease_s, self.enqueue_timeout = lease_s, enqueue_timeout
        self.keep_every = lease_s / 4   # a file name's lease is extended as often as the reader beats
        self.in_flight = in_flight
        self.member = producer_name(name)
        self.progress_every = progress_every
        self.pool = pool or default_pool
        self.counters = ReaderCounters(readers)
        self.role = None
        self.producer = None
        self.state = None  # the broker's last word on the instance queue's producers (Producer.state)
        self.names_pushed = 0
        self._halt = threading.Event()  # stop working: a stop was asked for, or the pipeline is over
        self._stop_reason = None
        self._stop_requested = threading.Event()
        self._producer_done = threading.Event()
        self._local_error = None
        self._abandoned = []
        self._exhausted = []  # reader threads that saw the end of the file names
        self._threads = []
        self._beat_thread = None

    # ------------------------------------------------ lifecycle

    def start(self):
        """Open the queues, register as a producer of the instance queue, start the threads. Returns self."""
        self.instance_queue = open_instance_queue(self.broker, self.queue_name, self.components,
                                                  container=self.container, pool=self.pool, **self.queue_options)
        self.filename_queue = filename_queue(self.broker, self.queue_name + FILENAMES_SUFFIX, self.container,
                                             self.filename_capacity, self.pool)
        self.producer = Producer(self.instance_queue, self.lease_s, self.member, at_least_once=self.at_least_once,
                                 rejoin_s=self.rejoin_s, source=self.filename_queue)
        self.state = self.producer.state
        self.role = "closed" if self.producer.closed else "producer" if self.producer.first else "reader"
        log.info("%s registered on pipeline %r as %s (%d reader threads)", self.member, self.queue_name, self.role,
                 self.readers)
        if self.role == "closed":
            self.producer.close()
            log.warning("pipeline %r is already closed: nothing to read (use a new queue name, or reset the "
                        "container, to read again)", self.queue_name)
            return self
        self.counters.started = time.monotonic()
        if self.role == "producer":
            self._spawn(self._produce, "producer")
        else:
            self._producer_done.set()
        for i in range(self.readers):
            self._spawn(self._read_files, f"reader-{i}", i)
        self._beat_thread = threading.Thread(target=self._beat_loop, name="beat", daemon=True)
        self._beat_thread.start()
        return self

    def run(self):
        """start() and wait(): the summary once the pipeline is over for this member."""
        return self.start().wait()

    def request_stop(self, reason="stopped"):
        """Ask the pipeline to stop (safe from a signal handler: wait() does the work)."""
        self._stop_reason = reason
        self._stop_requested.set()

    def wait(self):
        """Until this process is done and the pipeline closed (or failed, or stopped); returns the summary."""
        if self.role == "closed":
            return self.summary()
        while any(t.is_alive() for t in self._threads):
            if self._stop_requested.is_set() and not self._halt.is_set():
                self._stop_now()
            for t in self._threads:
                t.join(0.1)
        # at-least-once: an abandoned file's name was nacked, another reader reads it
        stopped_mid_work = (self._abandoned and not self.at_least_once) or not self._producer_done.is_set()
        if self._local_error is None and self._stop_reason and stopped_mid_work:
            self._fail(CancelledError(f"reader {self.member} was stopped ({self._stop_reason}) while reading "
                                      f"{', '.join(self._abandoned) or 'file names (producer)'}; the rest of "
                                      "that input is lost"))
        elif self._local_error is None:
            try:
                self._note(self.producer.done(len(self._exhausted) == self.readers, self.counters.snapshot()))
            except OpError as exc:
                self._local_error = exc
            if self.state["closed"] == "ok" and self.state["closed_by"] == self.member:
                log.info("every producer is done: %s closed the instance queue %r", self.member, self.queue_name)
        while self._local_error is None and self._stop_reason is None and self.state["closed"] is None:
            if self._stop_requested.is_set():
                self._stop_reason = self._stop_reason or "stopped"
                break
            self._stop_requested.wait(min(POLL_S, self.lease_s / 4))
        self._halt.set()
        if self._beat_thread is not None:
            self._beat_thread.join(CALL_TIMEOUT + 5)
        self.producer.close()
        summary = self.summary()
        log.info("%s: %s", self.member, _describe(summary))
        return summary

    def summary(self):
        """outcome: 'ok' (closed after every producer was done), 'failed' (the broker's error), 'error' (this
        process lost the broker), 'stopped' (left between files), 'already-closed';
        stopped: the reason given to request_stop, if any."""
        state = self.state
        code = None   # a failure's error code (common/errors.py): INVALID_ARGUMENT for a bad row
        if self._local_error is not None:
            outcome, error, code = "error", str(self._local_error), getattr(self._local_error, "code", None)
        elif state is not None and state["closed"] is not None and self.role != "closed":
            outcome, error = state["closed"], state["error"]
            code = state.get("code") if outcome == "failed" else None
        else:
            outcome = "already-closed" if self.role == "closed" else "stopped" if self._stop_reason else None
            error = None
        return {"member": self.member, "queue": self.queue_name, "role": self.role, "outcome": outcome,
                "error": error, "code": code, "stopped": self._stop_reason,
                "peer_lost": isinstance(self._local_error, UnavailableError),
                "closed_by": state["closed_by"] if state else None,
                "names_pushed": self.names_pushed, **self.counters.snapshot()}

    # ------------------------------------------------ threads

    def _spawn(self, target, name, *args):
        thread = threading.Thread(target=self._guarded, args=(target, *args), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guarded(self, target, *args):
        try:
            target(*args)
        except Exception as exc:  # any failure of a thread fails the pipeline, as TF's coordinator did
            if not self._halt.is_set():
                self._fail(exc if isinstance(exc, OpError) else InternalError(f"{type(exc).__name__}: {exc}"))
            else:
                log.debug("%s after the pipeline stopped: %s", threading.current_thread().name, exc)
        finally:
            self.pool.close_thread()

    def _produce(self):
        if not self.files:
            raise InvalidArgumentError(f"{self.member} runs the file-name producer of {self.queue_name!r} "
                                       "but was given no files")
        produced = string_input_producer(self.files.paths, self.broker, self.queue_name + FILENAMES_SUFFIX,
                                         self.container, self.num_epochs, self.shuffle_files, self.seed,
                                         self.filename_capacity, stop=self._halt, pool=self.pool)
        self.names_pushed = produced.names
        if produced.closed or self._halt.is_set():
            self._producer_done.set()

    def _read_files(self, index):
        fmt = self.counters.formats[index] = open_reader_format(self.format_kind, self.format_options)
        while not self._halt.is_set():
            try:
                name, stopped = wait_or_cancel(self.filename_queue.dequeue_async(
                    timeout=None, lease=self.lease_s if self.at_least_once else None), self._halt)
            except OutOfRangeError:
                self._exhausted.append(index)
                return
            except CancelledError:
                if self._halt.is_set():   # cancelled here, on the stop
                    return
                raise
            lease = name if self.at_least_once else None   # a Lease on the name (common/clients/leases.py)
            path = self._own_path((lease.values if lease else name).item())
            if stopped:   # a name that came as the wait was cancelled: given back, or left unread
                self._abandoned.append(path)
                if lease:
                    lease.settle(ack=False)
                return
            self.counters.reading[index] = path
            try:
                if not self._push_file(fmt, path, lease):
                    self._abandoned.append(path)
                    if lease:
                        lease.settle(ack=False)   # another reader reads it
                    return
            except CancelledError as exc:
                raise CancelledError(f"reader {self.member}: the instance queue {self.queue_name!r} was closed "
                                     f"while {path} was being pushed ({exc})") from None
            if lease:
                lease.settle(ack=True)
            self.counters.reading[index] = None
            self.counters.file_done()

    def _own_path(self, name):
        """The path this reader opens for a dequeued name: only one of its own files (ReaderFiles); any
        other name fails the pipeline with PermissionDenied, logged here."""
        try:
            return self.files.resolve(name, self.queue_name + FILENAMES_SUFFIX)
        except PermissionDeniedError as exc:
            log.error("%s refused a file name: %s", self.member, exc)
            raise

    def _push_file(self, fmt, path, lease=None):
        """Every chunk of `path` into the instance queue, up to `in_flight` pushes outstanding while the
        next chunk is parsed; False if a stop came first. A file name's lease is kept while it works."""
        pending = collections.deque()
        for chunk in fmt.read(path):
            if lease:
                lease.keep(self.keep_every)
            if self._halt.is_set():
                while pending:
                    self._settle(pending.popleft(), lease)
                return False
            values = {name: self._component(chunk, name) for name, _, _ in self.components}
            if self.ragged:
                futures = [self.instance_queue.enqueue_async({n: v[i] for n, v in values.items()},
                                                             timeout=self.enqueue_timeout) for i in range(chunk.count)]
            else:
                futures = [self.instance_queue.enqueue_many_async(values, timeout=self.enqueue_timeout)]
            pending.append((futures, chunk.count))
            while len(pending) > self.in_flight:
                self._settle(pending.popleft(), lease)
        while pending:
            self._settle(pending.popleft(), lease)
        return True

    def _component(self, chunk, name):
        values = chunk.features[name]
        dtype = self.cast.get(name)
        return values if dtype is None else values.astype(dtype, copy=False)

    def _settle(self, attempt, lease=None):
        futures, count = attempt
        try:
            for future in futures:
                while lease and not future.wait(self.keep_every):   # waiting for room: keep the file's name
                    lease.keep(self.keep_every)
                future.result()
        except DeadlineExceededError:
            raise DeadlineExceededError(f"instance queue {self.queue_name!r} had no room for {self.enqueue_timeout} s "
                                        "(are the consumers running?); part of a chunk may be in, so the pipeline "
                                        "cannot go on") from None
        self.counters.pushed(count)

    def _beat_loop(self):
        period = self.lease_s / 4
        last_log = time.monotonic()
        unreachable_since = None
        while not self._halt.wait(period):
            try:
                state = self.producer.beat(self.counters.snapshot())
                unreachable_since = None
            except UnavailableError as exc:  # the broker is away: keep trying for a lease, then give up
                unreachable_since = unreachable_since or time.monotonic()
                log.warning("beat failed: %s", exc)
                if time.monotonic() - unreachable_since > self.lease_s:
                    self._local_error = exc
                    self._halt.set()
                continue
            except OpError as exc:  # no longer a producer (its queue freed by a reset): stop
                self._local_error = self._local_error or exc
                self._halt.set()
                return
            self._note(state)
            if state["closed"] == "failed":
                self._halt.set()
            if self.progress_every and time.monotonic() - last_log >= self.progress_every:
                last_log = time.monotonic()
                log.info("%s", _describe(self.counters.snapshot()))

    def _note(self, state):
        """Keep the newest state seen; a closed one is never replaced (closing is final)."""
        if self.state is None or self.state["closed"] is None:
            self.state = state

    # ------------------------------------------------ stopping and failing

    def _stop_now(self):
        reading = [p for p in self.counters.reading if p and not self.at_least_once]   # leased: given back
        busy = reading or not self._producer_done.is_set()
        self._halt.set()
        if busy:
            what = ", ".join(reading) or "file names (producer)"
            self._fail(CancelledError(f"reader {self.member} was stopped ({self._stop_reason}) while reading {what}; "
                                      "the rest of that input is lost"))
        else:
            log.info("%s stopping (%s) between files", self.member, self._stop_reason)

    def _fail(self, error):
        """Fail the pipeline with `error` (a no-op if it is already over) and stop this member's work.
        The broker unreachable (UnavailableError): nothing can be recorded or closed there, so this
        member ends at once as a lost peer instead of waiting out a timeout per cleanup call."""
        self._halt.set()
        if isinstance(error, UnavailableError):
            self._local_error = self._local_error or error
            log.error("%s lost the broker: %s", self.member, error)
            return
        try:
            self._note(self.producer.fail(error))
        except OpError as exc:
            log.error("could not fail the pipeline on the broker (%s) after: %s", exc, error)
            self._local_error = self._local_error or error


def _describe(stats):
    line = (f"{stats['instances']:,} instances ({stats['instances_per_s']:,.0f}/s), {stats['files_done']} files done, "
            f"{stats['bytes_read'] / 1e6:.1f} MB read, {stats['malformed_skipped']} malformed skipped")
    if stats.get("reading"):
        line += f"; reading {', '.join(stats['reading'])}"
    if stats.get("outcome"):
        line += f"; pipeline {stats['outcome']}" + (f" by {stats['closed_by']}" if stats.get("closed_by") else "")
        if stats.get("error"):
            line += f": {stats['error']}"
    return line
