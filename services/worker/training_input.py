"""What a worker trains on, as one object `Trainer.fit` takes: the mini-batches of a broker queue (or
of a `PreloadedInput`), the next one always asked for while the step before computes, with what
comes with them: at-least-once leases. End of input is the queue's OutOfRange; a reader that died
mid-file fails the queue, and the dequeue answers its error (docs/queue-semantics.md §8)."""

from zmqflow.common.errors import DeadlineExceededError, OutOfRangeError
from zmqflow.services.worker.leased_batches import LeasedBatches

class TrainingInput:
    def __init__(self, queue, batch_size, timeout=600.0, at_least_once=False, lease_s=None, name="worker"):
        self.queue, self.batch_size, self.timeout = queue, batch_size, timeout
        self.at_least_once, self.name = at_least_once, name
        self.leases = LeasedBatches(lease_s)   # the batch in hand and the one whose push is in flight
        self._pending = None   # the dequeue in flight

    def next(self, before_waiting=lambda: None):
        """The next batch (its values), or None at the end of the input; the one after it is asked for
        at once. At least once, `before_waiting` runs before a wait: a closed queue waits for leased
        elements to come back, so the trainer acks what its push in flight carried first."""
        if self._pending is None:
            self._pending = self._dequeue()
        if self.at_least_once and not self._pending.wait(0):
            before_waiting()
        try:
            value = self._arrived(self._pending)
        except OutOfRangeError:
            return None
        except DeadlineExceededError:
            raise DeadlineExceededError(
                f"{self.name}: no mini-batch from queue '{self.queue.name}' at {self.queue.broker} within "
                f"{self.timeout:.0f} s; is a reader feeding it?") from None
        self._pending = self._dequeue()  # prefetch while computing
        self.leases.keep()
        return value

    def cancel(self):
        """Training stopped early: the batch asked for ahead is not wanted."""
        if self._pending is not None:
            self._pending.cancel()

    def end_for_every_worker(self):
        """Close the queue with cancel (the chief's early stop): every worker ends on OutOfRange, as at the
        end of the input. A preloaded input, sliced by each worker itself, has no queue to close."""
        close = getattr(self.queue, "close", None)
        if close is not None:
            close(cancel_pending_enqueues=True, timeout=30.0)

    def summary(self):
        """What at-least-once input acked and gave back, for the worker's summary."""
        if not self.at_least_once:
            return {}
        return {"leased_acked": self.leases.acked, "leased_returned": self.leases.returned}

    def _dequeue(self):
        if self.at_least_once:
            return self.queue.dequeue_up_to_async(self.batch_size, timeout=self.timeout, lease=self.leases.length())
        return self.queue.dequeue_up_to_async(self.batch_size, timeout=self.timeout)

    def _arrived(self, pending):
        return self.leases.arrived(pending.result())
