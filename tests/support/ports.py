"""Loopback ports nothing listens on: the kernel's ephemeral ones, or one offset that frees a whole topology."""

import random
import socket


def free_port():
    """An ephemeral loopback port that was free just now (bound, then released): a dead address to dial."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_offset(ports, tries=50):
    """An offset (a multiple of 100) that moves every port of a topology onto a free loopback port."""
    rng = random.Random()
    for _ in range(tries):
        offset = rng.randrange(10_000, 50_000, 100)
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
