"""The layering of docs/design.md, checked by import-linter's contracts in pyproject.toml.

import-linter finds modules by walking the root package's folder, and the repository keeps the
layers in their own top-level folders (setup.py maps them into `zmqflow`). So the check runs on
a copy laid out as installed: zmqflow/common, zmqflow/services, ...
"""

import ast
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ast.literal_eval(re.search(r"^FOLDERS = (\(.*?\))$", (REPO / "setup.py").read_text(), re.M).group(1))
OLD_TOP_LEVEL = {"common", "services", "bench", "loadtest", "models", "inputs", "jobs", "cli", "adapters"}


def _installed_layout(tmp_path):
    package = tmp_path / "zmqflow"
    shutil.copytree(REPO / "zmqflow", package, ignore=shutil.ignore_patterns("__pycache__"))
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, package / folder, ignore=shutil.ignore_patterns("__pycache__", "*.gz", "*.bin",
                                                                                        "*.tfrecord"))
    return tmp_path


def test_layers_and_no_cycles(tmp_path):
    root = _installed_layout(tmp_path)
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache", str(REPO / "pyproject.toml")], cwd=root, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _python_files():
    for folder in ("zmqflow", *FOLDERS, "tests"):
        yield from (REPO / folder).rglob("*.py")


def test_nothing_imports_the_folders_as_top_level_packages():
    """`from common.x import` works from a checkout (the folder is on sys.path) but not installed."""
    wrong = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            wrong += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                      if name.split(".")[0] in OLD_TOP_LEVEL]
    assert not wrong, "import these through zmqflow (zmqflow.common...):\n" + "\n".join(wrong)
