"""Status codes and exceptions: gRPC's canonical codes with TensorFlow's class names.

A service answers every failure with a code and a message; the client raises the
matching class, so `except OutOfRangeError` reads the same as in TensorFlow.
"""

import numbers
import reprlib

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16


class OpError(Exception):
    """Base of every zmqflow error; `code` is the canonical status code. `details` (a small dict) travels
    with it on the wire, e.g. `retry_after_ms`: how long a service that shed the request asks to be left alone."""

    code = UNKNOWN

    def __init__(self, message="", details=None):
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})

    def __str__(self):
        return self.message

    @property
    def retry_after(self):
        """Seconds the service asked the caller to wait before retrying, or None when it gave no hint."""
        ms = self.details.get("retry_after_ms")
        return ms / 1000.0 if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None


class CancelledError(OpError):
    code = CANCELLED


class UnknownError(OpError):
    code = UNKNOWN


class InvalidArgumentError(OpError):
    code = INVALID_ARGUMENT


class DeadlineExceededError(OpError):
    code = DEADLINE_EXCEEDED


class NotFoundError(OpError):
    code = NOT_FOUND


class AlreadyExistsError(OpError):
    code = ALREADY_EXISTS


class PermissionDeniedError(OpError):
    code = PERMISSION_DENIED


class ResourceExhaustedError(OpError):
    code = RESOURCE_EXHAUSTED


class FailedPreconditionError(OpError):
    code = FAILED_PRECONDITION


class AbortedError(OpError):
    code = ABORTED


class OutOfRangeError(OpError):
    code = OUT_OF_RANGE


class UnimplementedError(OpError):
    code = UNIMPLEMENTED


class InternalError(OpError):
    code = INTERNAL


class UnavailableError(OpError):
    code = UNAVAILABLE


class DataLossError(OpError):
    code = DATA_LOSS


class UnauthenticatedError(OpError):
    code = UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in OpError.__subclasses__()}


def check_int(what, value, low=0, optional=False):
    """`value` if it is an int >= `low` (a numpy one too, never a bool; None too when `optional`), else
    InvalidArgumentError naming `what`: the one check of an integer setting."""
    if (value is None and optional) or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                                        and value >= low):
        return value
    raise InvalidArgumentError(f"{what} must be an int >= {low}{' or None' if optional else ''}, got {value!r:.80}")


def did_you_mean(word, choices):
    """", did you mean 'name'?" when `word` is a likely typo of one of `choices`, else "": the one
    suggestion every unknown key, name or option gets."""
    import difflib
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f", did you mean {close[0]!r}?" if close else ""


def error_from_code(code, message, details=None):
    """The exception a client raises for a reply with status `code` (and the reply's `details`, if a dict)."""
    return _BY_CODE.get(code, UnknownError)(message, details if isinstance(details, dict) else None)


def code_name(code):
    """'OUT_OF_RANGE' for 11: for logs and CLI output."""
    for name, value in globals().items():
        if name.isupper() and value == code:
            return name
    return f"CODE_{code}"


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def shown(value):
    """`value` as an error message names it: bounded in length and depth, so a hostile value (a map a thousand
    deep off the wire) cannot make the message itself fail (repr's RecursionError once killed a service's loop)."""
    return _SHOWN.repr(value)
