"""numba for the processes that run its kernels (ps, worker, model server), without the modules it never uses.

numba imports scipy for a version check, and its CPU target, when it loads, imports scipy.linalg to see
whether np.dot and np.linalg can call BLAS inside jitted code (numba.np.arraymath's _check_blas). No kernel
of ours does (common/optimizers.py, models/kernels/numba_kernels.py: the matmuls stay numpy's `@`, outside
numba), so `load_numba` keeps scipy out while numba and its target load: 85 modules, ~12 MB and their import
time. np.dot in a later jitted function still works (numba imports scipy.linalg when it compiles one); only
np.convolve/np.correlate of floats then add in a loop instead of calling BLAS.

numba's config module imports yaml (17 modules, ~1 MB of the process's own memory, ~15 ms) for one purpose:
reading a `.numba_config.yaml` in the current directory. Where there is none, yaml is kept out too; where there
is one, numba imports yaml and reads it as before. And numba's typing of an array argument asks whether it is a
numpy.ma masked array, which imports numpy.ma (~1.3 MB); until something else imports it, no array can be one,
so arrays are typed without asking (`_type_arrays_without_numpy_ma`).

What stays: libllvmlite.so (LLVM) is mapped into the process, and loading numba and its compiled or cached
kernels touches ~68 MB of its code pages. They count in VmRSS (as RssFile), but they are the shared library's
pages in the page cache, shared by every process that maps it, not the process's own memory (RssAnon);
`zmqflow bench startup` reports both. Of them, ~35 MB are touched when the library is loaded (LLVM's static
initializers) and ~28 MB when numba compiles its runtime (NRT) through LLVM's optimizer and code generator, which
it does in every process that loads its CPU target, even when every kernel comes from its cache: with numba's
~570 modules (~38 MB of its own memory), a process that loads numba's target holds ~138 MB before any of ours.
"""

import os
import sys
import threading

_loading = threading.Lock()
_loaded = False

NUMBA_CONFIG_FILE = ".numba_config.yaml"
"""The file numba's config reads from the current directory, with yaml (numba.core.config)."""


def _unused_modules():
    """What numba would import for nothing here and the user has not imported: scipy (or only scipy.linalg,
    when scipy itself is imported), and yaml while there is no numba config file to read."""
    kept_out = [name for name in ("scipy", "scipy.linalg") if name not in sys.modules][:1]
    if "yaml" not in sys.modules and not os.path.isfile(NUMBA_CONFIG_FILE):
        kept_out.append("yaml")
    return kept_out


def load_numba():
    """The numba module, its CPU target loaded, without importing scipy, scipy.linalg or (with no numba config
    file) yaml if they are not already imported (by the user's code: then they stay), and typing arrays
    without importing numpy.ma."""
    global _loaded
    with _loading:
        if not _loaded:
            kept_out = _unused_modules()
            for name in kept_out:
                sys.modules[name] = None   # an import of it, or of a submodule, raises ImportError
            try:
                import numba  # noqa: F401  (numba itself, with those kept out: returned below)
                from numba.core.compiler_lock import global_compiler_lock
                from numba.core.registry import cpu_target
                with global_compiler_lock:
                    cpu_target.target_context.refresh()   # what the first compilation would load, loaded now
                _type_arrays_without_numpy_ma()
            finally:
                for name in kept_out:
                    if sys.modules.get(name, False) is None:
                        del sys.modules[name]
            _loaded = True
    return sys.modules["numba"]


def _type_arrays_without_numpy_ma():
    """numba types an ndarray argument (numba.core.typing.typeof) after asking whether it is a numpy.ma
    MaskedArray, and that `np.ma` makes numpy import numpy.ma: ~1.3 MB of the process's own memory and 8-25 ms
    in the first step of every worker, ps and model server, for a module none of them uses. A masked array can
    only exist once numpy.ma is imported, so until then arrays are typed as numba types them, without asking;
    once it is imported (by a user's code), numba's own typing, with its refusal of masked arrays, runs."""
    import numpy as np
    from numba.core import errors, types
    from numba.core.typing.typeof import typeof_impl
    from numba.np import numpy_support
    numbas = typeof_impl.dispatch(np.ndarray)

    @typeof_impl.register(np.ndarray)
    def typeof_ndarray(val, c):
        if "numpy.ma" in sys.modules:
            return numbas(val, c)
        try:
            dtype = numpy_support.from_dtype(val.dtype)
        except errors.NumbaNotImplementedError:
            raise errors.NumbaValueError(f"Unsupported array dtype: {val.dtype}")
        return types.Array(dtype, val.ndim, numpy_support.map_layout(val), readonly=not val.flags.writeable)
