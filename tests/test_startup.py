"""Start-up and memory (issue 26, item 6): `zmqflow bench startup --json` reports each role's ready time and RSS
against the bare-interpreter baseline, and the entry modules stay free of the heavy libraries they do not need,
so the laziness that made the roles start faster does not quietly regress. No timed assertion: the figures are
the benchmark's (docs/performance.md)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.service

NOT_AT_START = {
    # the umbrella CLI: `zmqflow --help`, and each subcommand pays for its own imports only (cli/main.py)
    "zmqflow.cli.main": ("numpy", "numba", "scipy", "prometheus_client", "asyncio", "pydantic"),
    # `zmqflow ping` / `zmqflow healthcheck`: every few seconds in every container
    "zmqflow.cli.ops": ("numba", "scipy", "prometheus_client", "asyncio", "zmq.auth", "urllib.request"),
    # ml_dtypes: imported when bfloat16 is first named or met (common/wire/dtypes.py), never by a broker
    "zmqflow.services.broker.server": ("numba", "scipy", "prometheus_client", "asyncio", "zmq.auth",
                                       "urllib.request", "pydantic", "ml_dtypes"),
    "zmqflow.services.broker.cli": ("numba", "scipy", "prometheus_client", "asyncio", "zmq.auth", "ml_dtypes"),
    # the ps loads numba's update kernels (common/optimizers.py) when it builds its store, not at import
    "zmqflow.services.ps.cli": ("numba", "scipy", "prometheus_client", "asyncio", "zmq.auth"),
    "zmqflow.services.ps.server": ("numba", "scipy", "prometheus_client", "asyncio"),
    "zmqflow.services.aggregator.cli": ("numba", "scipy", "prometheus_client", "zmq.auth", "ml_dtypes"),
    "zmqflow.services.serve.server": ("numba", "scipy", "ml_dtypes"),
    "zmqflow.services.worker.cli": ("numba", "scipy", "prometheus_client"),
    # a job spec names the default optimizer: `zmqflow train` and `up` read it without compiling its kernels
    "zmqflow.jobs.spec": ("numba", "scipy"),
}


@pytest.mark.unit
@pytest.mark.parametrize("module", sorted(NOT_AT_START))
def test_an_entry_module_does_not_import_what_its_start_does_not_need(module):
    check = (f"import sys, {module}; heavy = [m for m in {NOT_AT_START[module]!r} if m in sys.modules]; "
             "print(' '.join(heavy))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"importing {module} loads {done.stdout.strip()}"


BFLOAT16_ON_DEMAND = """
import json, sys
from zmqflow.common.wire import dtypes
import numpy as np
before = "ml_dtypes" in sys.modules
float32 = dtypes.name_of(np.zeros(2, np.float32))
untouched = "ml_dtypes" in sys.modules
import ml_dtypes
made_first = dtypes.name_of(np.zeros(2, ml_dtypes.bfloat16))   # an array of the caller's, before any lookup
print(json.dumps([before, float32, untouched, made_first, str(dtypes.as_numpy("bfloat16")),
                  str(dtypes.to_array([1.5], "bfloat16").dtype), "bfloat16" in dtypes.DTYPE_NAMES]))
"""


@pytest.mark.unit
def test_bfloat16_loads_ml_dtypes_only_when_named():
    """common/wire/dtypes.py imports ml_dtypes (~1.7 MB) at bfloat16's first lookup, not with the module; a
    bfloat16 array the caller made beforehand is still named, and the name still converts."""
    done = subprocess.run([sys.executable, "-c", BFLOAT16_ON_DEMAND], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, "float32", False, "bfloat16", "bfloat16", "bfloat16", True]


AT_REST = """
import json, sys
import numpy as np
from zmqflow.models.kernels import get_backend
from zmqflow.services.ps.store import VariableStore

store = VariableStore({"w": ((3, 4), np.dtype(np.float32))}, {"kind": "adam", "learning_rate": 0.1})  # a ps's
kernels = get_backend("numba")                                                                        # a worker's
x, w, b = np.arange(6, dtype=np.float32).reshape(2, 3) / 6, np.ones((3, 4), np.float32), np.zeros(4, np.float32)
dense = kernels.dense(x, w, b, "sigmoid")
print(json.dumps({"scipy": sorted(m for m in sys.modules if m.split(".")[0] == "scipy"),
                  "yaml": sorted(m for m in sys.modules if m.split(".")[0] == "yaml"),
                  "numpy.ma": "numpy.ma" in sys.modules,
                  "right": bool(np.allclose(dense, 1 / (1 + np.exp(-(x @ w)))))}))
import scipy.linalg                   # a user's own imports still work afterwards
import yaml
assert yaml.safe_load("a: 1") == {"a": 1}
"""


@pytest.mark.unit
def test_compiled_kernels_hold_no_scipy(tmp_path):
    """A ps's update kernels and a worker's (or model server's) numba kernels, compiled: scipy was never imported
    (common/jit.py keeps numba's BLAS check from loading scipy.linalg), nor yaml (no numba config file to read
    in the current directory), nor numpy.ma (numba's check for masked arrays), the kernels give the right answer, and a user's later `import scipy.linalg` and
    `import yaml` still work."""
    done = subprocess.run([sys.executable, "-c", AT_REST], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rest = json.loads(done.stdout.strip().splitlines()[-1])
    assert rest["scipy"] == [] and rest["yaml"] == [] and rest["right"]
    assert rest["numpy.ma"] is False


ARRAY_TYPING = """
import json, sys
import numpy as np
from zmqflow.common.jit import load_numba
numba = load_numba()
from numba.core.typing.typeof import Purpose, typeof, typeof_impl

arrays = [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64, order="F"), np.zeros((4, 4), np.int64)[:, ::2],
          np.zeros(5, np.uint8), np.zeros((), np.bool_), np.zeros((2, 2), np.complex64)]
arrays[3].flags.writeable = False
ours = [str(typeof(a, Purpose.argument)) for a in arrays]
try:
    typeof(np.zeros(2, np.dtype([("a", object)])), Purpose.argument)
except numba.core.errors.NumbaValueError as e:
    refused = str(e)
before = "numpy.ma" in sys.modules
import numpy.ma                      # a user's code imports it: numba's own typing from then on
numbas = [str(typeof(a, Purpose.argument)) for a in arrays]
try:
    numba.njit(lambda a: a.sum())(np.ma.masked_array([1.0, 2.0], mask=[0, 1]))
    masked = "typed"
except numba.core.errors.TypingError as e:
    masked = str(e)
print(json.dumps({"before": before, "ours": ours, "numbas": numbas, "refused": refused, "masked": masked}))
"""


@pytest.mark.unit
def test_arrays_are_typed_as_numba_types_them_without_importing_numpy_ma():
    """common/jit.py types ndarray arguments without touching np.ma while numpy.ma is not imported (numba's check
    would import it: ~1.3 MB): the same numba types as numba's own typing gives once numpy.ma is imported, the
    same refusal of an unsupported dtype, and a masked array still refused with numba's error."""
    done = subprocess.run([sys.executable, "-c", ARRAY_TYPING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    typed = json.loads(done.stdout.strip().splitlines()[-1])
    assert typed["before"] is False
    assert typed["ours"] == typed["numbas"]
    assert typed["ours"][:2] == ["array(float32, 2d, C)", "array(float64, 2d, F)"]
    assert "Unsupported array dtype" in typed["refused"]
    assert "Unsupported array type: numpy.ma.MaskedArray" in typed["masked"]


@pytest.mark.unit
def test_a_numba_config_file_is_still_read(tmp_path):
    """With a .numba_config.yaml in the current directory, load_numba lets numba import yaml and apply it."""
    (tmp_path / ".numba_config.yaml").write_text("developer_mode: 1\n")
    check = ("import sys; from zmqflow.common.jit import load_numba; numba = load_numba(); "
             "print(numba.core.config.DEVELOPER_MODE, 'yaml' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["1", "True"]


def test_bench_startup_reports_each_role_against_the_baseline():
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "startup", "--json", "--role", "broker",
                           "--rounds", "1", "--settle-secs", "0.2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "startup" and result["rounds"] == 1
    assert (result["target_ready_s"], result["target_rss_mb"]) == (1.0, 150.0)
    assert result["baseline"]["ready_s"] > 0 and result["baseline"]["rss_mb"] > 0
    assert list(result["roles"]) == ["broker"]
    for role, figures in result["roles"].items():
        assert figures["command"].startswith(f"zmqflow {role} --")
        assert figures["ready_s"] > 0 and len(figures["ready_s_each"]) == 1
        assert figures["rss_mb"] > result["baseline"]["rss_mb"] / 2     # the service's own process tree, read
        assert 0 < figures["rss_anon_mb"] and 0 < figures["rss_file_mb"]        # its own memory, its mapped files
        assert figures["rss_anon_mb"] + figures["rss_file_mb"] <= figures["rss_mb"] + 0.2   # both parts of VmRSS
        assert figures["ready_over_baseline"] == pytest.approx(figures["ready_s"] / result["baseline"]["ready_s"],
                                                               rel=0.02, abs=0.01)
        assert figures["ready_ok"] == (figures["ready_s"] <= 1.0)
        assert figures["rss_ok"] == (figures["rss_mb"] <= 150.0)
    assert result["all_ok"] == all(f["ready_ok"] and f["rss_ok"] for f in result["roles"].values())


@pytest.mark.unit
def test_a_role_starts_after_what_it_needs():
    from zmqflow.bench.startup import with_dependencies
    assert with_dependencies(["gateway"]) == ["serve", "aggregator", "gateway"]
    assert with_dependencies(["worker", "broker"]) == ["broker", "ps", "reader", "worker"]
    assert with_dependencies(["ps"]) == ["ps"]


def test_bench_startup_refuses_an_unknown_role():
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "startup", "--role", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope" in done.stderr
