"""TensorFlow device strings ("/job:ps/task:0/device:CPU:0") and nested device scopes.

`DeviceSpec` parses, prints and merges device strings as `tf.DeviceSpec` does, so a
placement written for TensorFlow reads the same here. `device_scope` is `tf.device`:
an inner partial spec fills in over the outer one, `None` clears the outer scopes, and a
device function (as `replica_device_setter` returns) decides from the op itself.

Decisions where TensorFlow is loose:
- Only CPU and GPU are device types (zmqflow has kernels for nothing else); they are
  accepted in any case and stored upper case, so "/gpu:0" == "/device:GPU:0".
- A field given twice in one string ("/job:a/job:b") is an error (TF keeps the last).
- "/device:GPU" (no index) is accepted and means any GPU, like "/device:GPU:*".
- Job names follow TF's C++ device-name rule: [A-Za-z][A-Za-z0-9_]*.
"""

import contextlib
import contextvars
import dataclasses
import re

from zmqflow.common.errors import InvalidArgumentError

DEVICE_TYPES = ("CPU", "GPU")
JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_FIELDS = ("job", "replica", "task", "device_type", "device_index")


def _check_job(job):
    if job is None or (isinstance(job, str) and JOB_NAME.match(job)):
        return job
    raise InvalidArgumentError(f"job name {job!r} is not valid: it must match [A-Za-z][A-Za-z0-9_]*")


def _check_number(field):
    def check(value):
        if value is None or value == "*" and field == "device_index":
            return None
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise InvalidArgumentError(f"{field} {value!r} is not valid: it must be a non-negative integer")
    return check


def _check_device_type(device_type):
    if device_type is None:
        return None
    if isinstance(device_type, str) and device_type.upper() in DEVICE_TYPES:
        return device_type.upper()
    raise InvalidArgumentError(
        f"device type {device_type!r} is not valid: it must be one of {', '.join(DEVICE_TYPES)}")


_CHECKS = {"job": _check_job, "replica": _check_number("replica"), "task": _check_number("task"),
           "device_type": _check_device_type, "device_index": _check_number("device_index")}


class DeviceSpec:
    """A possibly partial device: unset fields are None. Mutable like TF1's DeviceSpec."""

    __slots__ = _FIELDS

    def __init__(self, job=None, replica=None, task=None, device_type=None, device_index=None):
        self.job, self.replica, self.task = job, replica, task
        self.device_type, self.device_index = device_type, device_index

    def __setattr__(self, name, value):
        if name not in _CHECKS:
            raise AttributeError(f"DeviceSpec has no field {name!r}")
        object.__setattr__(self, name, _CHECKS[name](value))

    @classmethod
    def from_string(cls, spec):
        """Parse "/job:ps/replica:0/task:1/device:GPU:0" or any part of it ("gpu:1", "")."""
        if spec is not None and not isinstance(spec, str):
            raise InvalidArgumentError(f"device string {spec!r} is not a string")
        fields = {}
        for part in (spec or "").split("/"):
            if part:
                name, value = _parse_part(spec, part)
                if name in fields:
                    raise InvalidArgumentError(
                        f"device string {spec!r}: part {part!r} sets the {name.replace('_', ' ')} a second time")
                fields.update(value)
        try:
            return cls(**fields)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"device string {spec!r}: {e}") from None

    def to_string(self):
        """Canonical form, as TF: "/job:ps/replica:0/task:0/device:CPU:0", unset fields left out."""
        out = ""
        if self.job is not None:
            out += f"/job:{self.job}"
        if self.replica is not None:
            out += f"/replica:{self.replica}"
        if self.task is not None:
            out += f"/task:{self.task}"
        if self.device_type is not None:
            index = "*" if self.device_index is None else self.device_index
            out += f"/device:{self.device_type}:{index}"
        return out

    def merge_from(self, other):
        """In place, as TF1: every field set in `other` overrides this one's."""
        for name in _FIELDS:
            value = getattr(other, name)
            if value is not None:
                setattr(self, name, value)

    def make_merged_spec(self, other):
        """A new spec: this one with the fields set in `other` laid over it."""
        merged = self.replace()
        merged.merge_from(other)
        return merged

    def replace(self, **fields):
        """A copy with some fields changed (None unsets one)."""
        values = {name: getattr(self, name) for name in _FIELDS}
        values.update(fields)
        return DeviceSpec(**values)

    def __eq__(self, other):
        if not isinstance(other, DeviceSpec):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # mutable

    def __str__(self):
        return self.to_string()

    def __repr__(self):
        return f"DeviceSpec.from_string({self.to_string()!r})"


def _parse_part(spec, part):
    """One "/"-separated part -> (field it sets, {field: value})."""
    pieces = part.split(":")
    key = pieces[0]
    if len(pieces) == 2 and key in ("job", "replica", "task"):
        return key, {key: pieces[1]}
    if key.upper() in DEVICE_TYPES and len(pieces) <= 2:
        return "device_type", {"device_type": key, "device_index": pieces[1] if len(pieces) == 2 else None}
    if key == "device" and len(pieces) in (2, 3):
        return "device_type", {"device_type": pieces[1], "device_index": pieces[2] if len(pieces) == 3 else None}
    raise InvalidArgumentError(
        f"device string {spec!r}: part {part!r} is not job:NAME, replica:N, task:N, "
        f"device:TYPE:N, cpu:N or gpu:N")


@dataclasses.dataclass(frozen=True)
class Op:
    """The least a device function may look at: what `current_device(op)` accepts as an op."""
    name: str = ""
    type: str = ""
    device: str = ""


class _OpView:
    """What a device function sees: the op, with `device` as the inner scopes set it (TF's op.device)."""

    def __init__(self, op, device):
        self._op, self.device = op, device

    def __getattr__(self, name):
        return getattr(self._op, name)


_CLEAR = object()  # device_scope(None): ignore every outer scope


def _scope_entry(device):
    """Check a scope argument once, when the scope opens (as tf.device does)."""
    if device is None:
        return _CLEAR
    if isinstance(device, DeviceSpec):
        return device.replace()
    if isinstance(device, str):
        return DeviceSpec.from_string(device)
    if callable(device):
        return device
    raise InvalidArgumentError(f"device scope {device!r} is not a device string, DeviceSpec, function or None")


def _as_spec(device, source):
    if device is None:
        return DeviceSpec()
    if isinstance(device, DeviceSpec):
        return device.replace()
    if isinstance(device, str):
        return DeviceSpec.from_string(device)
    raise InvalidArgumentError(
        f"device function {source!r} returned {device!r}, not a device string or DeviceSpec")


def _resolve(entries, op):
    """TF's rule: innermost scope first; a spec fills in unset fields, a function decides outright."""
    if op is None or isinstance(op, str):
        op = Op(name=op or "")
    current = _as_spec(getattr(op, "device", None) or None, op)
    for entry in reversed(entries):
        if entry is _CLEAR:
            break
        if isinstance(entry, DeviceSpec):
            if entry.to_string():  # an empty spec ("") changes nothing
                current = entry.make_merged_spec(current)
        else:
            current = _as_spec(entry(_OpView(op, current.to_string())), entry)
    return current


class DeviceStack:
    """An explicit stack of device scopes, for code that keeps its own (a graph, a test)."""

    def __init__(self):
        self._entries = []

    def push(self, device):
        self._entries.append(_scope_entry(device))

    def pop(self):
        self._entries.pop()

    @contextlib.contextmanager
    def scope(self, device):
        self.push(device)
        try:
            yield
        finally:
            self.pop()

    def resolve(self, op=None):
        """The device of `op` (an Op, any object with .name/.type/.device, a name, or None)."""
        return _resolve(self._entries, op)


# The ambient scopes: a tuple per context, so threads and asyncio tasks never see each other's.
_SCOPES = contextvars.ContextVar("zmqflow_device_scopes", default=())


@contextlib.contextmanager
def device_scope(device):
    """`with tf.device(device):` - a string, DeviceSpec, device function, or None to clear."""
    token = _SCOPES.set(_SCOPES.get() + (_scope_entry(device),))
    try:
        yield
    finally:
        _SCOPES.reset(token)


def scope_entries():
    """The enclosing scopes, outermost first (strings as DeviceSpecs; device functions as given)."""
    return _SCOPES.get()


def current_device(op=None):
    """The merged spec the enclosing `device_scope`s give `op` (empty spec outside any)."""
    return _resolve(_SCOPES.get(), op)
