"""A worker from its WorkerConfig, one part per function: model, ps client, input, hooks; then `fit`.

The order is the chief's protocol: the model and its placement first (every task computes
the same placement from the same variable list), then the input, then the hooks; after
training the chief evaluates, shuts the ps shards and broker down when asked, and writes
the summary file that launchers read.
"""

import dataclasses
import json
import logging
import os
import re

from zmqflow.common.errors import AbortedError, InvalidArgumentError, NotFoundError, OpError, UnavailableError
from zmqflow.common.cluster.placement import place
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.rpc import admin_token
from zmqflow.common.spec_files import read_spec_file
from zmqflow.models.registry import model_variables
from zmqflow.models.spec import resolve_model
from zmqflow.services.worker import hooks as H
from zmqflow.services.worker.config import UsageError
from zmqflow.services.worker.devices import build_model
from zmqflow.services.worker.trainer import Trainer
from zmqflow.services.worker.training_input import TrainingInput

log = logging.getLogger("worker")

PEER_LOST = 3
"""Exit code of a task that lost a peer it cannot do without (documented in deploy/README.md)."""


class WorkerExit(SystemExit):
    """The worker stops with a code that says why (PEER_LOST or 1), after logging the peer or error."""


def placed_model(config, spec):
    """The model with its layers on their devices (services/worker/devices.py); InvalidArgumentError if not."""
    return build_model(spec, backend=config.backend, device=config.device,
                       placement_function=config.placement_function,
                       allow_soft_placement=config.allow_soft_placement,
                       log_device_placement=config.log_device_placement,
                       gpu_memory_fraction=config.gpu_memory_fraction, towers=config.towers, job=config.job,
                       task=config.task)


def ps_client(config, spec):
    """A client of every ps shard, knowing the placement of the model's variables over them."""
    placement = place(model_variables(spec), len(config.ps_endpoints), config.placement_strategy,
                      config.max_shard_bytes)
    if config.is_chief:
        log.info("placement over %d ps shards:\n%s", len(config.ps_endpoints), placement.table())
    return PsClient(config.ps_endpoints, placement, bf16=config.bf16, name=f"worker{config.task_index}")


def training_input(config, ps, replica=None, replicas=None):
    """Where mini-batches come from: a data set preloaded on ps 0 (replica `replica` of `replicas` takes its
    share; default: the worker's index of the job's workers), or the broker's instance queue."""
    if config.preloaded and config.at_least_once:
        raise UsageError("--at-least-once leases batches of a broker queue; --preloaded input is sliced by row on "
                         "the ps (nothing to lease): drop one of them")
    if config.preloaded:
        from zmqflow.services.worker.preloaded_input import PreloadedInput
        queue = PreloadedInput(ps, config.preloaded, ps.preloaded_rows(config.preloaded), config.epochs,
                               config.batch_size, config.task_index if replica is None else replica,
                               replicas or config.num_workers)
    elif config.broker:
        from zmqflow.common.clients import queues
        try:
            queue = queues.attach(config.queue_name, container=config.container, broker=config.broker, timeout=120.0)
        except OpError as exc:
            stop_on_error(config, exc)
    else:
        raise UsageError("no input: pass --broker (and --queue) or --preloaded")
    return TrainingInput(queue, config.batch_size, config.dequeue_timeout, config.at_least_once,
                         config.lease, name=f"worker {config.task_index}")


def training_hooks(config):
    """(hooks, the chief's TensorBoard hook or None): logging, stop, checkpoints, summaries, metrics, users'."""
    hooks = [H.LoggingHook(config.log_every)]
    if config.max_steps:
        hooks.append(H.StopAtStepHook(config.max_steps))
    if config.is_chief and config.checkpoint_dir:
        hooks.append(H.CheckpointHook(config.checkpoint_dir, config.checkpoint_every_steps,
                                      config.checkpoint_every_secs, config.keep_checkpoints))
    summaries = None
    if config.summaries:
        from zmqflow.services.worker.summary_hook import SummaryHook
        summaries = SummaryHook(config.summaries, config.summary_every_steps)
        hooks.append(summaries)
    hooks += [H.load_hook(h) for h in config.user_hooks]
    from zmqflow.common.processes import metrics
    from zmqflow.common.processes.service_cli import serve_metrics
    if metrics.requested() and serve_metrics():  # --metrics-bind
        from zmqflow.services.worker.metrics_hook import MetricsHook
        hooks.append(MetricsHook(config.name))
    tensorboard = None
    if config.is_chief and config.tensorboard_dir:
        from zmqflow.services.worker.tensorboard import TensorBoardHook
        tensorboard = TensorBoardHook(config.tensorboard_dir, config.summary_every_steps)
        hooks.append(tensorboard)
    if config.is_chief and (config.validate_every_steps or config.validate_every_secs):
        if not config.data_config:
            raise UsageError("validation needs --data-config (the data spec with a validation split)")
        from zmqflow.services.worker.validation import ValidationHook
        hooks.append(ValidationHook(recorded(config), config.validate_every_steps, config.checkpoint_dir, tensorboard,
                                    early_stop_patience=config.early_stop_patience, summaries=summaries,
                                    every_secs=config.validate_every_secs, monitor=config.early_stop_metric))
    return hooks, tensorboard


@dataclasses.dataclass
class PipelineTask:
    """Where a worker of a pipelined job stands: the model's `stages`, the one it runs (`stage`), which copy
    of the pipeline it is in (`replica` of `replicas`: workers r*S..r*S+S-1 are copy r), and the endpoints of
    the stages it sends to ({stage: endpoint})."""

    stages: list
    stage: int
    replica: int
    replicas: int
    downstream: dict


def pipeline_task(config, model):
    """The worker's PipelineTask when the model's layers name worker tasks (models/stages.py), else None;
    UsageError when the workers are not a whole number of pipelines or a link is not given."""
    from zmqflow.models.stages import is_pipelined, split_stages
    if not is_pipelined(model):
        return None
    stages = split_stages(model)
    if config.num_workers % len(stages):
        raise UsageError(f"the model's layers run on {len(stages)} workers (/job:worker/task:0..{len(stages) - 1}): "
                         f"the job has {config.num_workers} (--num-workers); it must be {len(stages)}, or a multiple "
                         f"of it for data-parallel copies of the pipeline")
    replica, index = divmod(config.task_index, len(stages))
    stage, downstream = stages[index], {}
    for entry in (config.pipeline_next,) if isinstance(config.pipeline_next, str) else config.pipeline_next or ():
        named = re.fullmatch(r"(\d+)=(.+)", entry)
        if named is None and len(stage.downstream) != 1:
            raise UsageError(f"--pipeline-next {entry}: stage {index} sends to stages {stage.downstream}; give each "
                             "as STAGE=ENDPOINT")
        target, endpoint = (int(named[1]), named[2]) if named else (stage.downstream[0], entry)
        if target not in stage.downstream:
            raise UsageError(f"--pipeline-next {entry}: stage {index} does not send to stage {target} (it sends to "
                             f"{stage.downstream or 'none: it is the output stage'})")
        downstream[target] = endpoint
    missing = [k for k in stage.downstream if k not in downstream]
    if missing:
        raise UsageError(f"worker {config.task_index} runs pipeline stage {index} of {len(stages)}: pass "
                         f"--pipeline-next for stage {', '.join(map(str, missing))}: STAGE=ENDPOINT, the endpoint that "
                         "stage listens on (its --bind)")
    return PipelineTask(stages, index, replica, config.num_workers // len(stages), downstream)


def stage_token(config):
    """The token a pipeline's stages know each other by without CURVE: the job's, which the ps they all
    use holds (the environment's, else the one ps 0 wrote on this machine)."""
    return admin_token.for_client(config.ps_endpoints[0], admin_token.JOB_TOKEN) if config.ps_endpoints else None


def run_stage(config, model, pipeline, ps):
    """A worker of a pipelined model whose stage is not 0: serve it until the stages before it say the
    training ended."""
    from zmqflow.services.worker.stage_link import StageLink, serve_stage
    stage = pipeline.stages[pipeline.stage]
    link = StageLink(index=pipeline.stage, bind=config.bind, downstream=pipeline.downstream,
                     timeout=config.pipeline_timeout, job_token=stage_token(config))
    if config.ready_file:
        from zmqflow.common.processes.service_cli import write_ready_file
        write_ready_file(config.ready_file, link.endpoint)
    log.info("worker %d: pipeline stage %d of %d (%s) of copy %d, listening on %s", config.task_index, stage.index,
             len(pipeline.stages), ", ".join(layer.name for layer in stage.layers), pipeline.replica, link.endpoint)
    try:
        ps.wait_ready(timeout=600.0)
        summary = serve_stage(stage, ps, link, model)
    except OpError as exc:
        stop_on_error(config, exc)
    finally:
        link.close()
    log.info("worker %d: stage done after %d batches (%d micro-batches)", config.task_index, summary["batches"],
             summary["micro_batches"])
    ps.close()
    return summary


def replica_name(config):
    """An in-graph replica's name in errors and logs: its task and, when given, its device
    (/job:worker/task:1, /job:worker/task:1/device:GPU:0)."""
    from zmqflow.common.cluster.device import DeviceSpec
    task = DeviceSpec(job=config.job, task=config.task)
    return (task.make_merged_spec(DeviceSpec.from_string(config.device)) if config.device else task).to_string()


def run_replica(config, model, spec, ps):
    """A replica of in-graph replication (--in-graph): serve the client's steps on this worker's model, ps
    client and share of the input (services/worker/replica.py) until it says the end."""
    from zmqflow.common.processes.service_cli import write_ready_file
    from zmqflow.services.worker.replica import ReplicaService
    if config.at_least_once:
        raise UsageError("--at-least-once acks a batch once its step's push is on the ps; an in-graph replica's "
                         "gradients reach the ps through its client: drop --at-least-once or --in-graph")
    name = replica_name(config)

    def start():
        batches = training_input(config, ps)
        trainer = Trainer(model, ps, replica=config.task_index, num_workers=config.num_workers, is_chief=False,
                          batch_size=config.batch_size, mode="async", config={"model": spec})
        trainer.begin()
        return trainer, batches

    service = ReplicaService(config.bind, name, len(config.ps_endpoints), start)
    if config.ready_file:
        write_ready_file(config.ready_file, service.endpoint)
    log.info("%s: an in-graph replica listening on %s", name, service.endpoint)
    service.run()
    if service.client_lost:
        raise WorkerExit(PEER_LOST)
    if config.result_file and service.summary:
        write_summary(config.result_file, service.summary)
    return service.summary


def in_graph_client(config, model, spec, ps):
    """The client of in-graph replication (--replica, repeated): a chief Trainer that drives the replicas."""
    from zmqflow.common.clients.replica import ReplicaClient
    from zmqflow.services.worker.in_graph import InGraphTrainer
    replicas = []
    for address in config.replicas:
        try:
            with ReplicaClient(address, address) as probe:
                name = probe.info(timeout=config.replica_timeout)["replica"]
        except OpError as exc:
            stop_on_error(config, UnavailableError(f"in-graph replica at {address}: {exc}"))
        replicas.append(ReplicaClient(address, name, timeout=config.replica_timeout))
    log.info("in-graph client of %d replicas (%s): %s", len(replicas), config.mode,
             ", ".join(f"{r.name} at {r.address}" for r in replicas))
    return InGraphTrainer(model, ps, replicas, mode=config.mode, step_timeout=config.replica_timeout,
                          batch_size=config.batch_size, checkpoint_dir=config.checkpoint_dir,
                          examples_per_epoch=config.examples_per_epoch or recorded(config).get("train_rows"),
                          config={"model": spec, "backend": config.backend, **data_config(config)})


def run(config):
    """Train until the input ends (or a hook stops it), then finish as the chief's protocol says."""
    spec = resolve_model(config.model_spec)
    model = placed_model(config, spec)
    if config.mode == "allreduce":
        return run_allreduce(config, spec, model)
    ps = ps_client(config, spec)
    if config.in_graph and config.replicas:
        raise UsageError("--in-graph makes this worker a replica, --replica the client of replicas: pass one")
    if config.in_graph:
        return run_replica(config, model, spec, ps)
    pipeline = pipeline_task(config, model)
    if pipeline and pipeline.stage > 0:
        return run_stage(config, model, pipeline, ps)
    replica, replicas = (pipeline.replica, pipeline.replicas) if pipeline else (config.task_index, config.num_workers)
    if pipeline:      # stage 0 of a copy of the pipeline: one replica to the ps and to the input
        from zmqflow.services.worker.stage_link import PipelineModel, StageLink
        model = PipelineModel(model, pipeline.stages,
                              StageLink(downstream=pipeline.downstream, timeout=config.pipeline_timeout,
                                        job_token=stage_token(config)),
                              config.micro_batches, versions=lambda: list(ps.versions))
    batches = None if config.replicas else training_input(config, ps, replica, replicas)
    hooks, tensorboard = training_hooks(config)
    trainer = in_graph_client(config, model, spec, ps) if config.replicas else Trainer(
        model, ps, replica=replica, num_workers=replicas,
        is_chief=config.is_chief, batch_size=config.batch_size, mode=config.mode, checkpoint_dir=config.checkpoint_dir,
        examples_per_epoch=config.examples_per_epoch or recorded(config).get("train_rows"),
        config={"model": spec, "backend": config.backend, **data_config(config)})
    try:
        summary = trainer.fit(batches, hooks)
    except OpError as exc:  # a peer we cannot do without is gone: say which, exit non-zero
        if pipeline:
            model.finish(exc)
        stop_on_error(config, exc)
    except BaseException as exc:
        if pipeline:
            model.finish(exc)
        raise
    if pipeline:
        model.finish()
    return conclude(config, trainer, summary, hooks, tensorboard, ps)


def conclude(config, trainer, summary, hooks, tensorboard, ps=None):
    """After training: the chief's evaluation, the hooks' summaries, the end of the job, the summary file."""
    if config.is_chief and config.evaluate:
        summary.update(evaluate_on_data(trainer, recorded(config), tensorboard, summary["global_step"]))
    for hook in hooks:
        summary.update(getattr(hook, "summary", dict)())
    if tensorboard is not None:
        tensorboard.close()
    finish(config, ps)
    if config.result_file:
        write_summary(config.result_file, summary)
    return summary


def run_allreduce(config, spec, model):
    """--mode allreduce: no ps; the workers reduce their gradients over a ring (services/worker/allreduce.py)."""
    from zmqflow.common.optimizers import DEFAULT_OPTIMIZER
    from zmqflow.common.processes.task_options import parse_json_option
    from zmqflow.services.worker.allreduce import AllReduceTrainer
    from zmqflow.models.stages import is_pipelined
    from zmqflow.services.worker.ring_link import RingLink
    if is_pipelined(model):
        raise UsageError("a model whose layers run on several workers (a pipeline) trains with a ps, not with "
                         "--mode allreduce")
    if config.preloaded:
        raise UsageError("--preloaded slices a data set held on ps 0; --mode allreduce has no ps: feed the workers "
                         "from a broker queue (--broker)")
    if config.validate_every_steps or config.validate_every_secs:
        raise UsageError("validation during training reads the variables from the ps; --mode allreduce has none: "
                         "score the checkpoints with `zmqflow evaluate`")
    optimizer = parse_json_option(config.optimizer, "--optimizer") if config.optimizer else dict(DEFAULT_OPTIMIZER)
    batches = training_input(config, None)
    hooks, tensorboard = training_hooks(config)
    link = RingLink(config.task_index, config.num_workers, config.bind, chief=config.chief,
                    lost_after=config.lost_after, lost_policy=config.lost_policy)
    try:
        if config.ready_file:
            from zmqflow.common.processes.service_cli import write_ready_file
            write_ready_file(config.ready_file, link.endpoint)
        log.info("worker %d of %d: all-reduce ring endpoint %s", config.task_index, config.num_workers, link.endpoint)
        trainer = AllReduceTrainer(model, link, optimizer, replica=config.task_index, num_workers=config.num_workers,
                                   is_chief=config.is_chief, batch_size=config.batch_size,
                                   checkpoint_dir=config.checkpoint_dir,
                                   examples_per_epoch=config.examples_per_epoch or recorded(config).get("train_rows"),
                                   config={"model": spec, "backend": config.backend, **data_config(config)})
        summary = trainer.fit(batches, hooks)
    except OpError as exc:   # a lost worker (abort), the chief lost, the broker gone: say which, exit non-zero
        stop_on_error(config, exc)
    finally:
        link.close()
    return conclude(config, trainer, summary, hooks, tensorboard)


def recorded(config):
    """The --data-config file's JSON (spec, stats; train_rows and shards from `zmqflow data prepare`), or {}."""
    if not config.data_config:
        return {}
    try:
        return read_spec_file(config.data_config, "--data-config")
    except NotFoundError:
        raise UsageError(f"--data-config {config.data_config} does not exist (`zmqflow data prepare` or "
                         "`zmqflow train` writes it)") from None
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None


def data_config(config):
    """{"data": {spec, stats}} from --data-config, for the checkpoints; {} without it."""
    data = recorded(config)
    return {"data": {"spec": data["spec"], "stats": data["stats"]}} if data else {}


def evaluate_on_data(trainer, data, tensorboard, global_step):
    """The chief's metrics on the data spec's test split (its validation split when it has no test; without a
    recorded data spec, the shipped MNIST sample's): what a deployment without a launcher reports at the end
    (logged, and to TensorBoard: `accuracy`, ... for the test split, `validation/accuracy`, ... else)."""
    from zmqflow.inputs.data_spec import fit, from_config, load_spec, load_tables, prepare
    from zmqflow.inputs.metrics import metrics
    spec = from_config(data) if data else load_spec("mnist")
    tables = load_tables(spec)
    if not data:
        fit(spec, tables["train"])
    split = "test" if "test" in tables else "validation" if "validation" in tables else None
    if split is None:
        log.info("no test or validation split to evaluate on")
        return {}
    prepared = prepare(spec, tables[split])
    outputs = trainer.model.predict(trainer.current_params(), prepared.x)
    result = metrics(outputs, prepared.y, spec.label.task)
    log.info("%s metrics: %s", split, ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
    if tensorboard is not None:
        for name, value in result.items():
            tensorboard.add_scalar(name if split == "test" else f"{split}/{name}", value, global_step)
    return {"test_split": split, "test_metrics": result,
            **({"test_accuracy": result["accuracy"]} if "accuracy" in result else {})}


def finish(config, ps):
    """The end of the job: the chief tells the ps shards (an all-reduce job has none) and the broker to exit
    when asked."""
    if config.is_chief and config.shutdown_ps and ps is not None:
        ps.shutdown()
    if config.is_chief and config.shutdown_broker and config.broker:
        shutdown_broker(config.broker)
    if ps is not None:
        ps.close()


def write_summary(path, summary):
    """Atomically: a launcher polling the file never reads half of it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, path)


def stop_on_error(config, exc):
    """Name the failing peer and exit: PEER_LOST when a service is unreachable or the input pipeline
    lost a reader, 1 for any other error."""
    log.error("worker %d stops: %s: %s", config.task_index, type(exc).__name__, exc)
    raise WorkerExit(PEER_LOST if isinstance(exc, (UnavailableError, AbortedError)) else 1) from None


def shutdown_broker(broker):
    """Ask the broker to exit; one that is already gone is no error at the end of a job."""
    from zmqflow.common.clients.broker import BrokerClient
    try:
        with BrokerClient(broker, heartbeat_interval=5.0) as client:
            client.shutdown(by="the chief")
    except OpError as exc:
        log.warning("broker shutdown: %s: %s", type(exc).__name__, exc)
