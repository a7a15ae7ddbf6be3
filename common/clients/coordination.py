"""TensorFlow's `tf.train.Coordinator` and `QueueRunner` for producers users write themselves.

    coord = zmqflow.Coordinator()
    queue = FIFOQueue(1000, ["float32", "int32"], [[3], []], names=["input", "label"], shared_name="train")
    runner = zmqflow.QueueRunner(queue, [read_my_rows])   # each producer returns a batch, or None at its end
    threads = runner.create_threads(coord, start=True)
    ...                                                   # workers dequeue "train" as usual
    coord.join(threads)                                   # re-raises the first producer error

When every producer has ended, the runner closes the queue (consumers get OutOfRange after the
last element). When one fails, the coordinator is asked to stop with that error and the queue is
closed with cancel_pending_enqueues, so no consumer waits for data that will not come.
"""

import contextlib
import threading
import time

from zmqflow.common.errors import OutOfRangeError


class Coordinator:
    """Threads stop together: any thread may request a stop (with an exception), all poll `should_stop`,
    and `join` waits for them, re-raising the first exception that was not a clean stop."""

    def __init__(self, clean_stop_exception_types=(OutOfRangeError,)):
        self._clean = tuple(clean_stop_exception_types)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._exception = None
        self._registered = []

    def should_stop(self):
        return self._stop.is_set()

    def request_stop(self, ex=None):
        """Ask every thread to stop; `ex` (an exception) is kept, unless it is a clean stop."""
        with self._lock:
            if ex is not None and not isinstance(ex, self._clean) and self._exception is None:
                self._exception = ex
            self._stop.set()

    def clear_stop(self):
        with self._lock:
            self._exception = None
            self._stop.clear()

    @contextlib.contextmanager
    def stop_on_exception(self):
        """A block whose exception requests a stop instead of escaping (TF's with coord.stop_on_exception())."""
        try:
            yield
        except Exception as exc:
            self.request_stop(exc)

    def wait_for_stop(self, timeout=None):
        """True once a stop was requested (False when `timeout` s passed first)."""
        return self._stop.wait(timeout)

    def register_thread(self, thread):
        self._registered.append(thread)

    def raise_requested_exception(self):
        if self._exception is not None:
            raise self._exception

    def join(self, threads=None, stop_grace_period_secs=120.0, ignore_live_threads=False):
        """Wait until a stop is requested or every thread has ended, give the rest `stop_grace_period_secs`,
        then re-raise the first error. Threads still alive after the grace period are a RuntimeError."""
        threads = list(self._registered) + list(threads or [])
        while not self._stop.is_set() and any(t.is_alive() for t in threads):
            self._stop.wait(0.05)
        deadline = time.monotonic() + stop_grace_period_secs
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.raise_requested_exception()
        stragglers = [t.name for t in threads if t.is_alive()]
        if stragglers and not ignore_live_threads:
            raise RuntimeError(f"threads did not stop within {stop_grace_period_secs} s of the stop request: "
                               f"{', '.join(stragglers)}")


class QueueRunner:
    """Threads that fill `queue` from producer functions: `producer()` returns a batch for
    `enqueue_many` ({component: rows} or a list), or None (or raises OutOfRangeError) at its end."""

    def __init__(self, queue, producers, enqueue_timeout=600.0):
        if not producers or not all(callable(p) for p in producers):
            raise TypeError("QueueRunner needs a list of producer callables")
        self.queue, self.producers, self.enqueue_timeout = queue, list(producers), enqueue_timeout
        self._lock = threading.Lock()
        self._running = 0
        self.exceptions = []

    def create_threads(self, coord, daemon=True, start=False):
        threads = [threading.Thread(target=self._run, args=(coord, producer), daemon=daemon,
                                    name=f"queue-runner-{i}") for i, producer in enumerate(self.producers)]
        self._running = len(threads)
        for thread in threads:
            coord.register_thread(thread)
            if start:
                thread.start()
        return threads

    def _run(self, coord, producer):
        try:
            while not coord.should_stop():
                try:
                    batch = producer()
                except OutOfRangeError:
                    batch = None
                if batch is None:
                    break
                self.queue.enqueue_many(batch, timeout=self.enqueue_timeout)
        except Exception as exc:
            self.exceptions.append(exc)
            coord.request_stop(exc)
            self._close(cancel=True)
            return
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last or coord.should_stop():
            self._close(cancel=coord.should_stop() and not last)

    def _close(self, cancel):
        try:
            self.queue.close(cancel_pending_enqueues=cancel, timeout=30.0)
        except Exception:
            pass            # already closed (by another runner thread, or the queue's owner)
