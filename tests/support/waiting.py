"""One bounded wait for tests: poll a condition instead of sleeping, and say what never happened."""

import inspect
import time


def wait_for(predicate, timeout=5.0, what=None, *, interval=0.05, retry_on=()):
    """predicate()'s first truthy value, polled every `interval` s for at most `timeout` s.

    Exceptions of the types in `retry_on` count as "not yet" (a service still starting up). When time
    runs out, AssertionError names `what` (the predicate's source when not given) and the last outcome.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = predicate()
        except retry_on as error:
            last = error
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or describe(predicate)} "
                                 f"(last: {last!r:.300})")
        time.sleep(interval)


def describe(predicate):
    """The predicate's source line (a lambda's call site), for the timeout message."""
    try:
        return " ".join(inspect.getsource(predicate).split())[:200]
    except (OSError, TypeError):
        return repr(predicate)
