"""docs/models.md runs as written, and the examples it names exist and run."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "models.md")


@pytest.mark.unit
def test_models_doc_python_runs_as_written():
    with open(DOC) as f:
        text = f.read()
    scope = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if "zmqflow.adapters" in block:
            continue   # the adapters' blocks need their framework's model (examples/jax_model.py, torch_model.py)
        if "onnxruntime" in block:
            continue   # needs an exported file: tests/export/test_export_command.py runs it after `zmqflow export`
        exec(compile(block, "docs/models.md", "exec"), scope)
    assert [v.name for v in scope["model"].variables()][:2] == ["embedding/embeddings", "dense/kernel"]
    for path in re.findall(r"`((?:examples|tests)/[\w/]+\.py)", text):
        assert os.path.exists(os.path.join(ROOT, path)), path


@pytest.mark.integration
@pytest.mark.parametrize("example, expected", [("tabular_embedding.py", "test RMSE"),
                                               ("my_model.py", "on the batch it fitted")])
def test_quick_examples_run(example, expected):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", example)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and expected in done.stdout, done.stderr[-2000:]
