"""numba for the processes that run its kernels (ps, worker, model server), without the scipy it never uses.

numba imports scipy for a version check, and its CPU target, when it loads, imports scipy.linalg to see
whether np.dot and np.linalg can call BLAS inside jitted code (numba.np.arraymath's _check_blas). No kernel
of ours does (common/optimizers.py, models/kernels/numba_kernels.py: the matmuls stay numpy's `@`, outside
numba), so `load_numba` keeps scipy out while numba and its target load: 85 modules, ~12 MB and their import
time. np.dot in a later jitted function still works (numba imports scipy.linalg when it compiles one); only
np.convolve/np.correlate of floats then add in a loop instead of calling BLAS.

What stays: libllvmlite.so (LLVM) is mapped into the process, and loading numba and its compiled or cached
kernels touches ~68 MB of its code pages. They count in VmRSS (as RssFile), but they are the shared library's
pages in the page cache, shared by every process that maps it, not the process's own memory (RssAnon);
`zmqflow bench startup` reports both.
"""

import sys
import threading

_loading = threading.Lock()
_loaded = False


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
                import numba  # noqa: F401  (numba itself, with scipy kept out: returned below)
                from numba.core.compiler_lock import global_compiler_lock
                from numba.core.registry import cpu_target
                with global_compiler_lock:
                    cpu_target.target_context.refresh()   # what the first compilation would load, loaded now
            finally:
                if kept_out and sys.modules.get(kept_out, False) is None:
                    del sys.modules[kept_out]
            _loaded = True
    return sys.modules["numba"]

