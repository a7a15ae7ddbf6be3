"""Every ```python block of the docs runs as written, here: README.md, docs/*.md and deploy/**/*.md, each doc's
blocks in order in one namespace, in a temporary folder that holds the shipped examples/.

What a block talks to is started first by this module's fixtures (a broker; two model servers of random
checkpoints behind an aggregator and a gateway), and the doc's loopback addresses are swapped for theirs (SETUPS).
A block that imports an optional library runs where it is installed (JAX, onnxruntime, tritonclient: the test
extra); one that imports PyTorch runs only in the torch tier (`make test-torch`). A block these tests do not run
sits under `<!-- not run here: REASON -->` naming the test that runs the same thing (tests/test_doc_shell.py checks
the rule), and what a block leaves behind is checked where it matters (CHECKS). Also: the examples models.md names
exist and the quick ones run.
"""

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.common.clients.aggregator import AggregatorClient
from tests.support import free_port
from tests.support.doc_blocks import DOCS, ROOT, blocks
from tests.support.processes import alive

OPTIONAL = {"jax", "onnxruntime", "tritonclient", "grpc"}   # a block needing one that is absent is skipped
MEMBERS = 2                                                  # model servers behind the docs' aggregator


def needs_torch(block):
    """Whether a block imports PyTorch (itself, safetensors.torch, or zmqflow's adapter)."""
    names = [alias.name for node in ast.walk(ast.parse(block.body)) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module for node in ast.walk(ast.parse(block.body))
              if isinstance(node, ast.ImportFrom) and node.module]
    return any("torch" in name.split(".") for name in names)


def python_blocks_run_here(doc):
    return [block for block in blocks(doc) if block.language == "python" and block.reason is None]


DOCS_WITH_PYTHON = [doc for doc in DOCS if python_blocks_run_here(doc)]
DOCS_WITH_TORCH = [doc for doc in DOCS_WITH_PYTHON if any(map(needs_torch, python_blocks_run_here(doc)))]


# ------------------------------------------------------------ what the blocks talk to

@dataclass
class Ensemble:
    aggregator: str      # its ZeroMQ endpoint
    members: list        # the model servers' endpoints


@pytest.fixture(scope="module")
def ensemble(module_processes, tmp_path_factory):
    """Two model servers of random MNIST MLP checkpoints behind an aggregator (the README's), answering already."""
    members = []
    for seed in range(1, MEMBERS + 1):
        ckpt = str(tmp_path_factory.mktemp(f"member-{seed}"))
        write_random_checkpoint(ckpt, seed)
        members.append(module_processes.service("zmqflow.services.serve", [
            "--checkpoint", ckpt, "--backend", "numpy", "--max-delay-secs", "0", "--model-name", f"m{seed}"]).endpoint)
    aggregator = module_processes.service("zmqflow.services.aggregator",
                                          [a for m in members for a in ("--member", m)] + ["--deadline-ms", "3000"])
    with AggregatorClient(aggregator.endpoint) as warm:   # the first answers load the models: not the docs' deadline
        for _ in range(3):
            warm.predict(np.zeros((4, 784), np.float32), deadline_ms=10_000, min_members=MEMBERS)
    return Ensemble(aggregator.endpoint, members)


@pytest.fixture(scope="module")
def gateway(module_processes, ensemble):
    """(HTTP HOST:PORT, gRPC HOST:PORT or None without grpcio) of a gateway in front of the ensemble."""
    pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")
    grpc = f"127.0.0.1:{free_port()}" if _installed("grpc") else None
    process = module_processes.service("zmqflow.services.gateway", ["--aggregator", ensemble.aggregator,
                                                                    *(["--grpc-bind", grpc] if grpc else [])],
                                       bind="127.0.0.1:0")
    return process.endpoint.removeprefix("http://"), grpc


def _installed(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _broker(request):
    """The module's broker, its queues freed (each doc's tour starts on an empty broker)."""
    from zmqflow.common.clients.queues import reset
    broker = request.getfixturevalue("broker")
    reset("", broker=broker)
    return {"tcp://127.0.0.1:5555": broker}


def _aggregator(request):
    return {"tcp://127.0.0.1:5800": request.getfixturevalue("ensemble").aggregator}


def _gateway(request):
    http, grpc = request.getfixturevalue("gateway")
    return {"localhost:8000": http, **({"localhost:8001": grpc} if grpc else {})}


CHECKPOINT_VALUES = {"hidden/weights": np.ones((3, 2), np.float32), "hidden/biases": np.zeros(2, np.float32)}


def _checkpoint(request):
    """docs/checkpoints.md opens ./ckpt."""
    from zmqflow.common.checkpoints.checkpoint import save_params
    from zmqflow.models.spec import MNIST_MLP
    save_params("ckpt", 5, CHECKPOINT_VALUES, {"model": MNIST_MLP, "data": {"spec": {"name": "mnist"}, "stats": {}}})
    return {}


# {doc: (its tier, setup(request) -> {text of its blocks: what it becomes here})}; any other doc: ("unit", None)
SETUPS = {
    "README.md": ("service", _aggregator),
    "docs/api.md": ("integration", None),       # a Job of real processes
    "docs/broker.md": ("service", _broker),
    "docs/checkpoints.md": ("unit", _checkpoint),
    "docs/data.md": ("integration", None),      # a local_cluster training
    "docs/queues.md": ("service", _broker),
    "docs/serving.md": ("service", _gateway),
}


# ------------------------------------------------------------ what the blocks leave behind

def _aggregator_answered(scope, printed):
    assert scope["probabilities"].shape == (4, 10) and len(scope["info"]["answered"]) == MEMBERS, scope["info"]


def _api_job(scope, printed):
    job, summary = scope["job"], scope["summary"]
    assert job.status == "finished" and summary["test_metrics"]["accuracy"] > 0.9
    assert not [pid for pid in job.pids() if alive(pid)]


def _api_serve(scope, printed):
    assert scope["info"]["predicted"] == ["a", "c"] and scope["outputs"].shape == (2, 3)   # the job's checkpoint


def _api_cluster(scope, printed):
    assert (scope["server"].replica, scope["server"].is_chief) == (2, False)
    assert "is not a job of the cluster (jobs: ps)" in printed


def _api_session(scope, printed):
    assert scope["accuracy"] > 0.85
    assert len(scope["own"].means) == 3 and scope["own"].means[-1] < scope["own"].means[0]   # 2 x 150 batches
    assert os.path.exists(os.path.join(scope["work"], "summaries.jsonl"))


def _api_validation(scope, printed):
    assert scope["validation"].best["accuracy"] > 0.9


def _broker_tour(scope, printed):
    assert len(scope["y"]) == 26 and scope["y"][-1] == 19


def _checkpoint_numpy(scope, printed):
    assert scope["weights"].keys() == CHECKPOINT_VALUES.keys()
    for name, value in CHECKPOINT_VALUES.items():
        np.testing.assert_array_equal(scope["weights"][name], value)


def _checkpoint_torch(scope, printed):
    np.testing.assert_array_equal(scope["state"]["hidden/weights"].numpy(), CHECKPOINT_VALUES["hidden/weights"])


def _data_from_python(scope, printed):
    summary = scope["summary"]      # what the block prints: the test split's metrics and the best validation
    assert set(summary["test_metrics"]) >= {"accuracy", "log_loss", "macro_f1"}, summary
    assert 0 < summary["best_validation"]["step"] <= summary["global_step"], summary
    assert printed.startswith(str(summary["test_metrics"])), printed


def _variables(*expected):
    def check(scope, printed):
        names = [v.name for v in scope["model"].variables()]
        assert names[:len(expected)] == list(expected), names
    return check


def _queues(scope, printed):
    lines = printed.splitlines()
    assert lines[0] == "[0 1 2 3]" and lines[1].startswith("[5 6 7 8 9]"), printed
    assert scope["leased"].seconds == 120 and scope["leased"].settled and scope["q"].size() == 0


def _triton(scope, printed):
    assert scope["probabilities"].shape == (4, 10) and len(scope["answered"].split(",")) == MEMBERS
    scope["client"].close()


# {(doc, a text of one of its blocks): check(scope, what the block printed)}, run right after that block
CHECKS = {
    ("README.md", "AggregatorClient("): _aggregator_answered,
    ("docs/api.md", "job.start()"): _api_job,
    ("docs/api.md", "zmqflow.serve("): _api_serve,
    ("docs/api.md", "Server.from_tf_config("): _api_cluster,
    ("docs/api.md", "class MeanLoss"): _api_session,
    ("docs/api.md", "ValidationHook("): _api_validation,
    ("docs/broker.md", "FIFOQueue("): _broker_tour,
    ("docs/checkpoints.md", "safetensors.numpy"): _checkpoint_numpy,
    ("docs/checkpoints.md", "safetensors.torch"): _checkpoint_torch,
    ("docs/data.md", "zmqflow.local_cluster("): _data_from_python,
    ("docs/models.md", "keras.Sequential("): _variables("conv2d/kernel", "conv2d/bias", "dense/kernel", "dense/bias"),
    ("docs/models.md", "keras.Model([numeric, city]"): _variables("embedding/embeddings", "dense/kernel"),
    ("docs/models.md", "JaxModel("): _variables("hidden/b", "hidden/w", "out/b", "out/w"),
    ("docs/models.md", "TorchModel("): _variables("0/weight", "0/bias", "2/weight", "2/bias"),
    ("docs/queues.md", "lease=30"): _queues,
    ("docs/serving.md", "tritonclient.http"): _triton,
    ("docs/serving.md", "tritonclient.grpc"): _triton,
}


# ------------------------------------------------------------ the runner

@pytest.fixture
def in_a_folder_of_the_docs(tmp_path, monkeypatch):
    """The blocks run in a temporary folder holding the shipped examples/ (their relative paths), no TF_CONFIG."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return tmp_path


def run_python_blocks(doc, request, with_torch):
    """Every Python block of `doc` the doc tests run, in order, in one namespace (PyTorch's only `with_torch`);
    the names of the blocks skipped for a library that is not installed."""
    tier_and_setup = SETUPS.get(doc, ("unit", None))
    replace = tier_and_setup[1](request) if tier_and_setup[1] else {}
    run = [block for block in python_blocks_run_here(doc) if with_torch or not needs_torch(block)]
    unused = [text for text in replace if not any(text in block.body for block in run)]
    assert not unused, f"{doc}: no block holds {unused} any more: update SETUPS"
    scope, skipped = {}, []
    for block in run:
        source = block.body
        for text, here in replace.items():
            source = source.replace(text, here)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):   # line numbers as the doc's, in a traceback
                exec(compile("\n" * block.line + source, os.path.join(ROOT, doc), "exec"), scope)
        except ModuleNotFoundError as missing:
            if (missing.name or "").split(".")[0] not in OPTIONAL:
                raise
            skipped.append(f"{block} ({missing.name} is not installed)")
            continue
        finally:
            sys.stdout.write(f"--- {block} printed:\n{printed.getvalue()}")
        for (checked_doc, text), check in CHECKS.items():
            if checked_doc == doc and text in block.body:
                check(scope, printed.getvalue())
    return skipped


@pytest.mark.parametrize("doc", [pytest.param(doc, marks=getattr(pytest.mark, SETUPS.get(doc, ("unit",))[0]))
                                 for doc in DOCS_WITH_PYTHON])
def test_the_python_blocks_run_as_written(doc, request, in_a_folder_of_the_docs):
    skipped = run_python_blocks(doc, request, with_torch=False)
    if skipped:
        pytest.skip(f"the other blocks ran; not run: {', '.join(skipped)} (pip install 'zmqflow[test]')")


@pytest.mark.torch
@pytest.mark.parametrize("doc", [pytest.param(doc, marks=getattr(pytest.mark, SETUPS.get(doc, ("unit",))[0]))
                                 for doc in DOCS_WITH_TORCH])
def test_the_pytorch_blocks_run_as_written(doc, request, in_a_folder_of_the_docs):
    pytest.importorskip("torch", reason="PyTorch is not installed (make test-torch installs it)")
    skipped = run_python_blocks(doc, request, with_torch=True)
    assert not skipped, skipped


@pytest.mark.unit
def test_every_check_and_setup_names_a_block_that_runs():
    """CHECKS and SETUPS follow the docs: a check whose block changed or left would never run."""
    for (doc, text), _ in CHECKS.items():
        holding = [str(block) for block in python_blocks_run_here(doc) if text in block.body]
        assert len(holding) == 1, f"CHECKS[{doc!r}, {text!r}]: {len(holding)} blocks that run hold it ({holding})"
    assert set(SETUPS) <= set(DOCS_WITH_PYTHON), set(SETUPS) - set(DOCS_WITH_PYTHON)
    assert "docs/models.md" in DOCS_WITH_TORCH and "docs/checkpoints.md" in DOCS_WITH_TORCH
    assert len(DOCS_WITH_PYTHON) >= 8, DOCS_WITH_PYTHON


# ------------------------------------------------------------ the examples docs/models.md names

@pytest.mark.unit
def test_the_files_models_md_names_exist():
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        for path in re.findall(r"`((?:examples|tests)/[\w/]+\.py)", f.read()):
            assert os.path.exists(os.path.join(ROOT, path)), path


@pytest.mark.integration
@pytest.mark.parametrize("example, expected", [("tabular_embedding.py", "test RMSE"),
                                               ("my_model.py", "on the batch it fitted")])
def test_quick_examples_run(example, expected):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", example)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and expected in done.stdout, done.stderr[-2000:]
