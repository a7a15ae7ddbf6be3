"""The broker's limits on queues and on the bytes they hold: refuse early, never run out of memory.

Bytes are charged when an enqueue is accepted (from then on its elements are
in the broker, waiting or stored) and released when they leave: in a
dequeue's reply, as the unused rest of a failed or withdrawn enqueue, or with
a freed queue. An element is charged its data and what storing it costs the
broker (a tuple in the queue, an array object per component): an int8 scalar
holds 1 byte of data and about 180 bytes of objects, so counting data alone let
a queue of scalars grow to about 145 times its quota. A refusal is ResourceExhaustedError naming the limit, the
amount asked for and what is held; nothing changes. 0 means unlimited.
"""

import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from zmqflow.common.errors import ResourceExhaustedError


@dataclass(frozen=True)
class BrokerLimits:
    max_queues: int = 0  # queues on the broker
    max_queues_per_container: int = 0
    max_queue_capacity: int = 0  # largest declared capacity (an unbounded queue is refused when set)
    max_container_bytes: int = 0  # element bytes one container's queues hold, pending enqueues included
    max_total_bytes: int = 0  # the same over every container


class Quota:
    """Counts the bytes held per container and in all; says no before a limit is crossed."""

    def __init__(self, limits=None):
        self.limits = limits or BrokerLimits()
        self.total_bytes = 0
        self.container_bytes = {}

    def check_new_queue(self, decl, queues, queues_in_container):
        """ResourceExhausted unless one more queue like `decl` fits the count and capacity limits."""
        lim, where = self.limits, f"queue {decl.shared_name or '(private)'!r} in container {decl.container!r}"
        if lim.max_queues and queues >= lim.max_queues:
            raise ResourceExhaustedError(f"cannot create {where}: the broker holds {queues} queues, "
                                         f"the max_queues limit ({lim.max_queues})")
        if lim.max_queues_per_container and queues_in_container >= lim.max_queues_per_container:
            raise ResourceExhaustedError(f"cannot create {where}: the container holds {queues_in_container} queues, "
                                         f"the max_queues_per_container limit ({lim.max_queues_per_container})")
        cap = decl.capacity
        if lim.max_queue_capacity and (cap < 0 or cap > lim.max_queue_capacity):
            asked = "an unbounded capacity" if cap < 0 else f"capacity {cap}"
            raise ResourceExhaustedError(f"cannot create {where} with {asked}: over the max_queue_capacity limit "
                                         f"({lim.max_queue_capacity})")

    def charge(self, container, n, queue_name):
        """Hold `n` more bytes for `container`, or ResourceExhausted naming the limit (nothing held then)."""
        lim, held = self.limits, self.container_bytes.get(container, 0)
        if lim.max_container_bytes and held + n > lim.max_container_bytes:
            raise ResourceExhaustedError(f"queue '{queue_name}': {n} more bytes would make container {container!r} "
                                         f"hold {held + n} bytes, over the max_container_bytes limit "
                                         f"({lim.max_container_bytes})")
        if lim.max_total_bytes and self.total_bytes + n > lim.max_total_bytes:
            raise ResourceExhaustedError(f"queue '{queue_name}': {n} more bytes would make the broker hold "
                                         f"{self.total_bytes + n} bytes, over the max_total_bytes limit "
                                         f"({lim.max_total_bytes})")
        self.container_bytes[container] = held + n
        self.total_bytes += n

    def hold_again(self, container, n):
        """Bytes released a moment ago come back (an undelivered dequeue): no limit check, they fitted."""
        self.container_bytes[container] = self.container_bytes.get(container, 0) + n
        self.total_bytes += n

    def release(self, container, n):
        self.container_bytes[container] -= n
        self.total_bytes -= n


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def default_max_total_bytes(cgroup_files=CGROUP_MEMORY_LIMITS):
    """(bytes, how they were found): half the memory this process may use, the cgroup's limit (a pod's, a
    container's) when one is set and below the machine's memory, else the machine's; 0 (unlimited) when
    neither is known. Half the node's memory let a broker in a 512 Mi pod queue gigabytes and be OOM-killed."""
    try:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        machine = 0
    for path in cgroup_files:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (not machine or int(text) < machine):  # "max" (v2) or a huge number: no limit
            return int(text) // 2, f"half the cgroup memory limit {int(text)} ({path})"
        break
    if machine:
        return machine // 2, f"half this machine's memory {machine} (no cgroup memory limit below it)"
    return 0, "unlimited: neither a cgroup memory limit nor the machine's memory is known"


ELEMENT_BYTES = sys.getsizeof((None,)) + 8                 # the element's tuple and its slot in the queue
COMPONENT_BYTES = sys.getsizeof(np.zeros((2, 1))[0])         # an array object (a row view) per component


def element_overhead(components):
    """Bytes one stored element costs beyond its data, for `components` components."""
    return ELEMENT_BYTES + components * COMPONENT_BYTES


def nbytes(array):
    """Bytes an array holds; a string array counts its strings too, not only its pointers."""
    if array.dtype.hasobject:
        return array.nbytes + sum(map(len, array.flat))
    return array.nbytes


def fixed_row_bytes(dtypes, shapes):
    """Bytes of every element (data and storage) of a queue whose elements all have one size, else None."""
    if shapes is None or any(dt.hasobject for dt in dtypes) or any(None in s for s in shapes):
        return None
    return sum(math.prod(s) * dt.itemsize for s, dt in zip(shapes, dtypes)) + element_overhead(len(dtypes))
