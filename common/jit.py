"""numba for the processes that run its kernels (ps, worker, model server), without what they never use at rest.

A ps, a worker and a model server each held 160-166 MB at rest (`zmqflow bench startup`), of which numba's
share is two things the kernels do not need once they are compiled:

- scipy: numba imports it for a version check, and its CPU target, when it loads, imports scipy.linalg to see
  whether np.dot and np.linalg can call BLAS inside jitted code (numba.np.arraymath's _check_blas). No kernel
  of ours does (common/optimizers.py, models/kernels/numba_kernels.py: the matmuls stay numpy's `@`, outside
  numba), so `load_numba` keeps scipy out while numba and its target load: 85 modules, ~12 MB.
  np.dot in a later jitted function still works (numba imports scipy.linalg when it compiles one);
  only np.convolve/np.correlate of floats then add in a loop instead of calling BLAS.
- LLVM's code: libllvmlite.so (170 MB) is mapped into the process, and loading numba and its compiled (or cached)
  kernels touches ~68 MB of its pages, which count in the RSS though LLVM runs only while compiling. `at_rest`,
  called once a process has compiled what it runs (its warm-up), unmaps those clean, file-backed pages
  (memory.unmap_clean_pages): they stay in the page cache, and a later compilation (a new signature) maps
  them again from there.
"""

import sys
import threading

from zmqflow.common import memory

LLVM_LIBRARY = "libllvmlite.so"
"""The shared library whose code pages `at_rest` unmaps."""

REGROWN_BYTES = 8 * 1024 * 1024
"""`at_rest` looks at the mappings again only once the process's file-backed RSS grew this much since it last did:
a test process builds many stores and models, each with its warm-up, and reading smaps costs ~15-25 ms."""

_loading = threading.Lock()
_loaded = False
_file_rss_at_rest = None


def load_numba():
    """The numba module, its CPU target loaded, without importing scipy or scipy.linalg if they are not
    already imported (by the user's code: then they stay)."""
    global _loaded
    with _loading:
        if not _loaded:
            kept_out = next((name for name in ("scipy", "scipy.linalg") if name not in sys.modules), None)
            if kept_out:
                sys.modules[kept_out] = None   # an import of it, or of a submodule, raises ImportError
            try:
                import numba
                from numba.core.compiler_lock import global_compiler_lock
                from numba.core.registry import cpu_target
                with global_compiler_lock:
                    cpu_target.target_context.refresh()   # what the first compilation would load, loaded now
            finally:
                if kept_out and sys.modules.get(kept_out, False) is None:
                    del sys.modules[kept_out]
            _loaded = True
    import numba
    return numba


def at_rest():
    """The process has compiled its kernels (after its warm-up): give back LLVM's code pages and the heap that
    compiling freed. Bytes unmapped; a no-op (0) in a process that has not loaded numba."""
    global _file_rss_at_rest
    if "numba" not in sys.modules:
        return 0
    if _file_rss_at_rest is not None and memory.file_rss_bytes() - _file_rss_at_rest < REGROWN_BYTES:
        return 0
    memory.release_freed_memory()
    unmapped = memory.unmap_clean_pages(LLVM_LIBRARY)
    _file_rss_at_rest = memory.file_rss_bytes()
    return unmapped
