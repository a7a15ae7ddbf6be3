"""Keep freed memory in the process instead of handing it back to the kernel.

Tensor frames of hundreds of KB are allocated and freed on every message.
glibc serves blocks above 128 KiB with mmap and returns them on free, so each
new block pays a page fault per 4 KiB page (about 4 us each here): 300 us for
one MNIST batch. Raising the mmap and trim thresholds makes malloc reuse the
freed blocks (and no mmap at all, since glibc caps the threshold at 32 MiB and a 64 MB
pull would still fault). Measured on the broker benchmark: 81,000 -> 132,000 batch items/s.
Services and compute processes call this once at start; it is a no-op where
glibc's mallopt is not available.
"""

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's upper bound on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024


def _libc():
    """glibc by its soname; elsewhere (musl) what ctypes.util finds, which runs ldconfig and whose import costs
    ~0.05 s: every service and compute process calls keep_freed_memory at start (bench startup)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        from ctypes.util import find_library
        return ctypes.CDLL(find_library("c") or "libc.so.6")


def release_freed_memory():
    """Give the freed heap back to the kernel now (glibc's malloc_trim): after refusing an oversized
    message, whose tens of MB keep_freed_memory would otherwise keep in the process. True when done."""
    try:
        libc = _libc()
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def keep_freed_memory():
    """Tune glibc malloc for large, repeated tensor buffers; True when applied."""
    try:
        libc = _libc()
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # no mmap at all: blocks above the 32 MiB threshold cap (a 64 MB pull) would still be mmapped
    return (bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            and bool(mallopt(M_MMAP_MAX, 0)))


def one_arena():
    """Serve every thread's malloc from one arena (glibc's M_ARENA_MAX=1); True when applied.

    Why, in a worker computing on one thread: glibc gives threads that allocate at once arenas of their own,
    and with freed memory kept (keep_freed_memory) each arena keeps what was freed into it. libzmq's I/O
    thread allocates every tensor frame the worker receives, so its arena kept a second set of blocks beside
    the compute thread's; with one arena they reuse one another's. `zmqflow bench startup`'s worker at rest:
    148.9-149.3 MB -> 148.3-148.5; pulls and pushes of the MLP as fast (bench/train.py's ps_rates, 4 runs
    alternated). Not for a worker computing on several threads (CPU towers), which would share one lock."""
    try:
        return bool(_libc().mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
