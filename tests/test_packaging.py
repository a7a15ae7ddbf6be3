"""The wheel as a user installs it: one top-level import name, the sample data inside, and the
commands working from an empty directory with nothing of the checkout on the path."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DATA = {"mnist_5k.csv.gz", "mnist_sample-00000-of-00002.tfrecord", "mnist_sample-00001-of-00002.tfrecord.gz",
                "mnist_sample.bin"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built from a copy of the source, so that setuptools' build/ and egg-info stay out of the checkout."""
    source, out = tmp_path_factory.mktemp("source") / "zmqflow", tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "tests",
                                                                 "__pycache__", "*.nbi", "*.nbc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--wheel-dir", str(out), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    [path] = out.glob("zmqflow-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The wheel unpacked by pip into its own directory; commands run from an empty one."""
    target = tmp_path_factory.mktemp("site")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                              "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    return target


def run_installed(installed, tmp_path, *argv):
    env = {**os.environ, "PYTHONPATH": str(installed), "PYTHONSAFEPATH": "1"}
    return subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_has_one_top_level_name_and_the_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"zmqflow", wheel.name.split("-py3")[0] + ".dist-info"}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("zmqflow/data/")} >= SHIPPED_DATA
    assert not [n for n in names if n.startswith("zmqflow/tests/")]
    # the web view's page and its charting library, served from the package (`zmqflow status --web`, offline)
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("zmqflow/jobs/status/static/")} >= {
        "index.html", "app.js", "style.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"}


def test_installed_package_runs_outside_the_checkout(installed, tmp_path):
    code = ("import zmqflow, zmqflow.inputs.datasets as d; "
            "x, y = d.load_mnist(); "
            "print(zmqflow.__file__); print(x.shape, y.shape)")
    result = run_installed(installed, tmp_path, sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    where, shapes = result.stdout.splitlines()
    assert where.startswith(str(installed)), where          # not the checkout's copy
    assert shapes == "(5000, 784) (5000,)"
    for top_level in ("common", "services", "bench", "loadtest"):
        gone = run_installed(installed, tmp_path, sys.executable, "-c", f"import {top_level}")
        assert gone.returncode != 0, f"`import {top_level}` works from an installed wheel"


def test_installed_commands(installed, tmp_path):
    import zmqflow
    version = run_installed(installed, tmp_path, str(installed / "bin" / "zmqflow"), "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"zmqflow, version {zmqflow.__version__}"
    for module in ("zmqflow.services.broker", "zmqflow.services.ps", "zmqflow.services.worker",
                   "zmqflow.services.reader", "zmqflow.services.serve", "zmqflow.services.aggregator", "zmqflow"):
        result = run_installed(installed, tmp_path, sys.executable, "-m", module, "--help")
        assert result.returncode == 0 and "Usage:" in result.stdout, (module, result.stderr)
