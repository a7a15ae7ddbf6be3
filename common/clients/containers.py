"""Resource containers, as TensorFlow 1.x's `tf.container`: the scope that names which container the
shared variables (common/clients/ps.py) and queues (common/clients/queues.py) a client makes belong to.

    with zmqflow.container("experiment0"):
        counter = session.variable("counter", initial_value=0)   # in container "experiment0"
    zmqflow.reset(target, ["experiment0"])                        # frees it (Session.reset)

Outside any scope the container is "" (TF's default container). The innermost scope wins; scopes are per
thread and per asyncio task (a context variable), as device scopes are.
"""

import contextlib
import contextvars

from zmqflow.common.errors import InvalidArgumentError

DEFAULT_CONTAINER = ""
_CONTAINER = contextvars.ContextVar("zmqflow_container", default=DEFAULT_CONTAINER)


@contextlib.contextmanager
def container(name):
    """Resources made inside belong to container `name` (a string; "" is the default container)."""
    token = _CONTAINER.set(check_container(name))
    try:
        yield name
    finally:
        _CONTAINER.reset(token)


def current_container():
    """The container of the innermost enclosing `container` scope ("" outside every one)."""
    return _CONTAINER.get()


def check_container(name, what="container"):
    """`name` when it is a string, else InvalidArgumentError naming `what`."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{what} must be a string (\"\" is the default container), got "
                                   f"{type(name).__name__} {name!r:.60}")
    return name


def containers_of(containers):
    """A list of container names from one name or a list of them (Session.reset's `containers`)."""
    if isinstance(containers, str):
        return [containers]
    if not isinstance(containers, (list, tuple)):
        raise InvalidArgumentError(f"containers must be a name or a list of names, got {type(containers).__name__}")
    return [check_container(c, "each container") for c in containers]
