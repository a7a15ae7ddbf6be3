"""zmqflow: TensorFlow 1.x style distributed training and ensemble serving as Python services over ZeroMQ.

The repository's folders are mapped into this one package (pyproject.toml, package-dir):

    common/   -> zmqflow.common     contracts: wire format, protocol, errors, RPC, clients, cluster, checkpoints
    models/   -> zmqflow.models     model specs, the built-in MLP, kernels (numpy, numba, cupy)
    inputs/   -> zmqflow.inputs     file formats and the shipped data sets
    services/ -> zmqflow.services   the six services: broker, ps, worker, reader, serve, aggregator
    jobs/     -> zmqflow.jobs       what runs services together: local_cluster (train), sweep, ensemble, up, status
    cli/      -> zmqflow.cli        the `zmqflow` command
    bench/, loadtest/, data/ -> zmqflow.bench, zmqflow.loadtest, zmqflow.data
"""

import importlib

from zmqflow.common.version import __version__  # noqa: F401  (one home: common/version.py)

API = {
    "local_cluster": "zmqflow.jobs.job", "Job": "zmqflow.jobs.job", "replicate": "zmqflow.jobs.job",
    "serve": "zmqflow.jobs.serving",
    "ModelClient": "zmqflow.common.clients.serve", "AggregatorClient": "zmqflow.common.clients.aggregator",
    "replica_device_setter": "zmqflow.common.cluster.replica_device_setter",
    "device": "zmqflow.common.cluster.device:device_scope", "ClusterSpec": "zmqflow.common.cluster.spec",
    "SummaryHook": "zmqflow.services.worker.summary_hook", "ValidationHook": "zmqflow.services.worker.validation",
    "Coordinator": "zmqflow.common.clients.coordination", "QueueRunner": "zmqflow.common.clients.coordination",
    "Server": "zmqflow.jobs.session", "MonitoredTrainingSession": "zmqflow.jobs.session",
    "Session": "zmqflow.jobs.session", "reset": "zmqflow.jobs.session",
    "container": "zmqflow.common.clients.containers",
    **dict.fromkeys(("StopAtStepHook", "CheckpointHook", "LoggingHook", "Hook", "StepContext"),
                    "zmqflow.services.worker.hooks"),
    "keras": "zmqflow.models.keras:",
}
"""The Python API: name -> its module (or module:attribute; "module:" is the module itself), imported on first
use."""

__all__ = sorted(API) + ["__version__"]
"""What `from zmqflow import *` gives and what IDEs and `help(zmqflow)` list, though nothing is imported yet."""


def __getattr__(name):
    """The Python API, imported on first use (so `import zmqflow` stays light)."""
    if name not in API:
        raise AttributeError(f"module 'zmqflow' has no attribute {name!r}")
    module, colon, attribute = API[name].partition(":")
    module = importlib.import_module(module)
    return module if colon and not attribute else getattr(module, attribute or name)


def __dir__():
    """dir(zmqflow) and tab completion list the lazy API beside what is already imported."""
    return sorted(set(globals()) | set(API))
