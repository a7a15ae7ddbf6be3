"""Loopback ports nothing listens on: the kernel's ephemeral ones, or one offset that frees a whole topology."""

import os
import random
import socket


def free_port():
    """An ephemeral loopback port that was free just now (bound, then released): a dead address to dial."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Offsets keep a topology below the kernel's ephemeral ports (32768 and up: /proc/sys/net/ipv4/ip_local_port_range),
# which any test's connections and `bind :0` take at any moment; the shipped topology's ports end near 9,100.
OFFSETS = range(10_000, 23_000, 100)


def free_port_offset(ports, tries=50):
    """An offset (a multiple of 100) that moves every port of a topology onto a free loopback port.

    Under pytest-xdist each worker draws from its own slice of OFFSETS, so two tests running at once never
    pick the same offset between the check and the bind."""
    rng = random.Random()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    mine = OFFSETS[index % count::count]
    for _ in range(tries):
        offset = rng.choice(mine)
        if all_free(port + offset for port in ports):
            return offset
    raise RuntimeError(f"no free port offset for {sorted(ports)} in {tries} tries")


def all_free(ports):
    """Whether every port can be bound on loopback now (checked by binding them all at once)."""
    sockets = []
    try:
        for port in ports:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in sockets:
            s.close()
