"""`zmqflow train`: flags -> a JobSpec (jobs/spec.py) -> zmqflow.jobs.local_cluster.run_training."""

import json

import click

from zmqflow.common.processes.service_cli import launcher_curve_option, option
from zmqflow.common.errors import OpError
from zmqflow.jobs.local_cluster import check_output_width, run_training
from zmqflow.jobs.spec import (DEFAULT_OPTIMIZER, INPUTS, LOST_POLICIES, MODES, REPLICATIONS, JobSpec, job_spec,
                               optimizer_config)
from zmqflow.models.kernels import BACKENDS
from zmqflow.models.registry import load_model
from zmqflow.models.spec import BUILTIN_TYPES, resolve_model, with_options


DEFAULT = JobSpec()


@click.command(name="train", context_settings={"show_default": True})
@launcher_curve_option()
@click.option("--num-ps", default=None, type=click.IntRange(min=0), show_default=f"{DEFAULT.cluster.ps}, none with "
              "--mode allreduce")
@click.option("--num-workers", default=DEFAULT.cluster.workers)
@click.option("--mode", default=DEFAULT.cluster.mode, type=click.Choice(MODES),
              help="async or sync: the ps shards apply the workers' gradients, as they come or averaged per step. "
                   "allreduce: no ps; the workers average their gradients over a ring among themselves, each "
                   "applying the optimizer to its own replica (docs/design.md).")
@click.option("--lost-policy", default=DEFAULT.cluster.lost_policy, type=click.Choice(LOST_POLICIES),
              help="--mode allreduce, a lost worker: the ring goes on without it, or the job stops naming it.")
@click.option("--lost-after-secs", default=DEFAULT.cluster.lost_after_secs,
              type=click.FloatRange(min=0, min_open=True),
              help="--mode allreduce: a worker silent this many seconds is lost.")
@click.option("--replication", default=DEFAULT.cluster.replication, type=click.Choice(REPLICATIONS),
              help="between-graph: every worker runs its own training loop. in-graph: one client drives the "
                   "workers as replicas, each on its own share of the input (--mode sync: their gradients averaged "
                   "into one update a step; async: each replica's pushed as it finishes).")
@click.option("--device", "devices", multiple=True, metavar="DEVICE",
              help="With --replication in-graph: replica i's device, once per worker in order (/gpu:1, "
                   "/job:worker/task:1/cpu:0). Default: each worker's default device.")
@click.option("--spare-replicas", default=DEFAULT.cluster.spare_replicas,
              help="Sync: extra workers beyond replicas_to_aggregate.")
@click.option("--elastic", is_flag=True,
              help="Sync: workers may join and leave while the job trains (ps --elastic): each step aggregates the "
                   "workers that are members then, and a lost worker does not fail the job.")
@click.option("--epochs", default=DEFAULT.training.epochs)
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="Rows a step. Default: 100, or a tenth of a train split under 1,000 rows (at least 10 steps an "
                   "epoch).")
@click.option("--optimizer", "optimizer_kind", default=DEFAULT_OPTIMIZER["kind"],
              type=click.Choice(["sgd", "momentum", "adam", "adagrad"]))
@click.option("--learning-rate", default=DEFAULT_OPTIMIZER["learning_rate"])
@click.option("--learning-rate-decay/--no-learning-rate-decay", default=DEFAULT.training.learning_rate_decay,
              help="The learning rate falls linearly to 0.0001 over the job's steps (tf.train.polynomial_decay's "
                   "defaults), so the last steps settle instead of jumping about the optimum.")
@click.option("--backend", default=DEFAULT.training.backend, type=click.Choice(BACKENDS))
@option("--shuffle-queue/--no-shuffle-queue", "shuffle_queue", old_names={"--fifo-queue": "--no-shuffle-queue"},
        default=None, help="Feed through a RandomShuffleQueue (tf.train.shuffle_batch), or a FIFOQueue "
        "(--no-shuffle-queue). Default: shuffle for readers, FIFO for preloaded input "
        "(the feeder already shuffles every epoch).")
@click.option("--input", default=None, type=click.Choice(INPUTS),
              help="readers: reader processes read the data's files every epoch; preloaded: fed from this "
                 "process's memory; ps: held once on ps 0 and sliced by the workers (the seeds' preloading). "
                 "Default: readers, or with --data preloaded when its rows fit in memory and no early stop.")
@click.option("--bf16", is_flag=True, help="bfloat16 pulls and pushes.")
@click.option("--at-least-once", is_flag=True, help="Workers dequeue batches and readers file names with leases, "
              "acked once the gradients are on the ps (the file in the queue): a task that dies gives its input "
              "back instead of losing it (not with --input ps; docs/queues.md).")
@click.option("--checkpoint-dir", default=None, type=click.Path(file_okay=False))
@click.option("--checkpoint-every-steps", default=None, type=int)
@click.option("--model", "model_spec", default=None, metavar="MODEL",
              help="A built-in model (mlp, cnn, logistic, linear), a function in your file (path/model.py:build) "
                   "or in a module on PYTHONPATH or in the current directory (my_module:build), called as "
                   "build(input_signature, **options) (plus outputs= and task= where it declares them), a spec "
                   "file (.json/.yaml) or inline JSON. With --data, a built-in is fitted to the data's inputs and "
                   "task (mlp and cnn also regress). Default: the MNIST MLP 784-100-10.")
@click.option("--model-opt", "model_opts", multiple=True, metavar="KEY=VALUE",
              help="A model option (repeatable), e.g. --model cnn --model-opt filters=[8,16] --model-opt dense=128. "
                   "pipeline={LAYER: TASK, ...} splits a model of zmqflow's layers over workers: each named layer "
                   "(and those after it that read it) on worker TASK (see docs/models.md, Pipelines).")
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="Train on your data: a data spec (YAML: files, features, label; see `zmqflow data inspect`) or "
                   "`mnist`. The model is fitted to its inputs and classes, and the final checkpoint is scored on "
                   "its test split. Default: the shipped MNIST sample.")
@click.option("--validate-every-steps", default=DEFAULT.validation.every_steps, type=click.IntRange(min=0),
              help="With --data that has a validation split: the chief scores it every N global steps (0: never) "
                   "and keeps the best checkpoint in CHECKPOINT_DIR/best.")
@click.option("--validate-every-secs", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Also validate when this many seconds passed since the last validation (whichever of steps and "
                   "seconds comes first).")
@click.option("--early-stop-patience", default=None, type=click.IntRange(min=1),
              help="With validation: end training when the validation metric has not improved for this many "
                   "validations; the best checkpoint is kept.")
@click.option("--early-stop-metric", default=None,
              type=click.Choice(["accuracy", "log_loss", "macro_f1", "auc", "rmse", "mae", "r2"]),
              help="The validation metric the best checkpoint and early stopping follow (lower is better for "
                   "log_loss, rmse and mae). Default: accuracy, or rmse for a regression.")
@click.option("--timeout-secs", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Stop the whole job (exit 1) if it has not ended after this many seconds. Default: no limit, "
                   "the job runs until it ends.")
@option("--json-out", "summary_out", old_names=["--summary-out"], default=None, type=click.Path(dir_okay=False),
        help="Write the job's summary here as JSON: final metrics, steps, examples/s, wall time.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def command(optimizer_kind, learning_rate, model_spec, model_opts, data_spec, timeout_secs, summary_out, as_json,
            **options):
    """Train a model (default: the MNIST MLP) on the shipped MNIST sample, or on your data with --data,
    with a broker, NUM_PS ps shards and NUM_WORKERS workers on this machine. If any task of the job
    fails, the others are stopped and the command exits 1 naming it."""
    from zmqflow.models.stages import stage_count
    data = fitted_data(data_spec)
    if data is not None and options["early_stop_metric"]:
        from zmqflow.inputs.metrics import monitored
        try:
            monitored(data.label.task, options["early_stop_metric"])     # a metric the task reports
        except OpError as exc:
            raise click.BadParameter(str(exc), param_hint="--early-stop-metric") from None
    model = model_for(model_spec, model_opts, data)
    try:
        built = load_model(model, backend="numpy")     # a bad model fails here, before any process starts
        if data is not None or model.get("type") not in BUILTIN_TYPES:   # (the launcher fits a built-in to MNIST)
            check_output_width(built, data)
        stages = stage_count(built)
    except OpError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    if options["elastic"] and options["mode"] != "sync":
        raise click.BadParameter("elastic applies to sync training: add --mode sync", param_hint="--elastic")
    if stages > 1 and (options["num_workers"] + options["spare_replicas"]) % stages:
        raise click.BadParameter(f"the model's layers run on {stages} workers (a pipeline); pass --num-workers "
                                 f"{stages}, or a multiple of it for data-parallel copies of the pipeline",
                                 param_hint="--num-workers")
    if options["devices"] and options["replication"] != "in-graph":
        raise click.BadParameter("places the replicas of --replication in-graph; between-graph workers take "
                                 "their devices from the model's layers", param_hint="--device")
    options["devices"] = tuple(options["devices"]) or None
    try:
        spec = job_spec(**options, optimizer=optimizer_config(optimizer_kind, learning_rate), model=model, data=data)
    except OpError as exc:    # options that make no job together: bad usage (V6)
        raise click.UsageError(str(exc)) from None
    try:
        summary = run_training(spec, progress=not as_json, timeout=timeout_secs)
    except OpError as exc:
        raise click.ClickException(str(exc)) from None
    if summary_out:
        with open(summary_out, "w") as f:
            json.dump(summary, f, indent=1)
    if as_json:
        click.echo(json.dumps(summary))
        return
    scores = ", ".join(f"{k} {v:.4f}" for k, v in (summary.get("test_metrics") or {}).items())
    when = (f"stopped early at step {summary['stopped_early_at']} (global step {summary['global_step']})"
            if summary.get("stopped_early_at") else f"after {spec.training.epochs} epochs")
    click.echo((f"{summary['test_split']}: {scores} " if scores else "") + f"{when}, {summary['examples_per_s']:,} "
               f"examples/s while training (logs in {summary['log_dir']})")


def fitted_data(data_spec):
    """The data spec fitted on its train split, or None: bad data fails here, naming the file, line and column."""
    if data_spec is None:
        return None
    from zmqflow.inputs.data_spec import fit, load_spec, load_tables
    try:
        data = load_spec(data_spec)
        fit(data, load_tables(data)["train"])
    except OpError as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from None
    return data


def model_for(model_spec, model_opts, data):
    """The model spec with its options, shaped for the data (None: as it is): a bad option fails here."""
    try:
        from zmqflow.inputs.data_spec import is_mnist_sample, model_for_data
        model = with_options(resolve_model(model_spec, data_mlp=data is not None and not is_mnist_sample(data)),
                             model_opts)
        if data is not None:
            model = model_for_data(data, model)
    except OpError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    return model
