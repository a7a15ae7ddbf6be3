"""Host names whose lookup is slow, without root: a getaddrinfo() shim (slow_names.c) loaded with LD_PRELOAD.

A listed name takes `seconds` and then fails the way a lookup whose DNS server never answers does
(EAI_AGAIN), in the C library itself, so libzmq's own lookups are as slow as Python's. Other names
resolve as usual. `slow_names_env(names, seconds, build_dir)` is the environment to start a process
with, or raises pytest's skip when no C compiler is installed.
"""

import os
import shutil
import subprocess

import pytest

SOURCE = os.path.join(os.path.dirname(__file__), "slow_names.c")


def build_shim(build_dir):
    """The shared library built from slow_names.c into `build_dir` (skips the test without a compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("a slow name lookup needs a C compiler (cc) to build its getaddrinfo shim")
    library = os.path.join(str(build_dir), "slow_names.so")
    built = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", library, SOURCE, "-ldl"],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, f"building {SOURCE} failed:\n{built.stderr}"
    return library


def slow_names_env(names, seconds, build_dir):
    """Environment variables under which each of `names` takes `seconds` to fail to resolve."""
    preload = " ".join(filter(None, [build_shim(build_dir), os.environ.get("LD_PRELOAD")]))
    return {"LD_PRELOAD": preload, "SLOW_NAMES": ",".join(names), "SLOW_NAMES_SECONDS": str(seconds)}
