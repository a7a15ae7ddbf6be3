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

from zmqflow.common.version import __version__  # noqa: F401  (one home: common/version.py)


def __getattr__(name):
    """The Python API, imported on first use (so `import zmqflow` stays light)."""
    if name == "local_cluster":
        from zmqflow.jobs.job import local_cluster
        return local_cluster
    if name == "serve":
        from zmqflow.jobs.serving import serve
        return serve
    if name in ("ModelClient", "AggregatorClient"):
        from zmqflow.common.clients import aggregator as aggregator_client, serve as serve_client
        return getattr(serve_client if name == "ModelClient" else aggregator_client, name)
    if name == "Job":
        from zmqflow.jobs.job import Job
        return Job
    if name == "replica_device_setter":
        from zmqflow.common.cluster.replica_device_setter import replica_device_setter
        return replica_device_setter
    if name == "device":
        from zmqflow.common.cluster.device import device_scope
        return device_scope
    if name == "SummaryHook":
        from zmqflow.services.worker.summary_hook import SummaryHook
        return SummaryHook
    if name == "ValidationHook":
        from zmqflow.services.worker.validation import ValidationHook
        return ValidationHook
    if name in ("Coordinator", "QueueRunner"):
        from zmqflow.common.clients import coordination
        return getattr(coordination, name)
    if name == "ClusterSpec":
        from zmqflow.common.cluster.spec import ClusterSpec
        return ClusterSpec
    if name in ("Server", "MonitoredTrainingSession"):
        from zmqflow.jobs import session
        return getattr(session, name)
    if name in ("StopAtStepHook", "CheckpointHook", "LoggingHook", "Hook", "StepContext"):
        from zmqflow.services.worker import hooks
        return getattr(hooks, name)
    raise AttributeError(f"module 'zmqflow' has no attribute {name!r}")
