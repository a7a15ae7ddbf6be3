"""`zmqflow-worker`: one training worker (task 0 is the chief)."""

import json
import logging
import os

import click

from zmqflow.common.cli_support import curve_option, ops_options, setup_logging
from zmqflow.common.errors import OpError
from zmqflow.common.memory import keep_freed_memory
from zmqflow.common.task_options import model_options, task_from_tf_config
from zmqflow.models.spec import resolve_model

PEER_LOST = 3
"""Exit code of a task that lost a peer it cannot do without (documented in deploy/README.md)."""


@click.command(name="worker", context_settings={"show_default": True})
@curve_option("Keys for CURVE: as a client, checks the ps, broker and peers against DIR/server.key; "
              "with --serve, also encrypts and accepts only the clients in DIR/authorized/")
@click.option("--ps", "ps_endpoints", multiple=True, help="A ps shard endpoint, in shard order (repeat); "
              "default: the ps job of TF_CONFIG.")
@click.option("--broker", default=None, envvar="ZMQFLOW_BROKER", help="The queue-broker endpoint.")
@click.option("--queue", "queue_name", default="train", help="shared_name of the instance queue to train from.")
@click.option("--container", default="", help="Resource container of the instance queue.")
@click.option("--preloaded", default=None, help="Train from this data set preloaded on ps 0 (sliced by row) "
              "instead of a broker queue.")
@click.option("--epochs", default=1, help="With --preloaded: passes over the data set.")
@click.option("--task-index", default=None, type=int, help="Worker index (default: TF_CONFIG, else 0).")
@click.option("--num-workers", default=None, type=int, help="Workers in the job (default: TF_CONFIG, else 1).")
@model_options
@click.option("--backend", default="numba", type=click.Choice(["numpy", "numba", "cupy"]),
              help="Kernels: numba (CPU), numpy (reference) or cupy (GPU).")
@click.option("--batch-size", default=100)
@click.option("--dequeue-timeout", default=600.0, help="Seconds to wait for a mini-batch before giving up "
              "(the error names the queue).")
@click.option("--mode", default="async", type=click.Choice(["async", "sync"]), help="Must match the ps shards.")
@click.option("--bf16", is_flag=True, help="Send pulls and pushes as bfloat16.")
@click.option("--max-steps", default=None, type=int, help="Stop at this global step (StopAtStepHook).")
@click.option("--log-every", default=100, help="Log a line every N steps.")
@click.option("--checkpoint-dir", default=None, type=click.Path(file_okay=False),
              help="Chief: restore from / save checkpoints here.")
@click.option("--checkpoint-every-steps", default=None, type=int)
@click.option("--checkpoint-every-secs", default=None, type=float)
@click.option("--keep-checkpoints", default=5)
@click.option("--summaries", default=None, type=click.Path(dir_okay=False), help="Chief: JSON-lines summaries file.")
@click.option("--summary-dir", default=None, type=click.Path(file_okay=False),
              help="Chief: TensorBoard event files here (loss, examples/s, staleness, accuracy). "
                   "Default: CHECKPOINT_DIR/train with --checkpoint-dir, else none; 'off' for none.")
@click.option("--summary-every-steps", default=50, type=click.IntRange(min=1), help="Chief: steps between summaries.")
@click.option("--hook", "user_hooks", multiple=True, help="A user hook 'module:Class' (repeat).")
@click.option("--evaluate", is_flag=True, help="Chief: report test accuracy on the MNIST test split at the end.")
@click.option("--shutdown-ps", is_flag=True, help="Chief: tell the ps shards to exit when training ends.")
@click.option("--shutdown-broker", is_flag=True, help="Chief: tell the broker to exit when training ends "
              "(every worker is done by then), so the whole job completes with exit 0.")
@click.option("--result-file", default=None, type=click.Path(dir_okay=False), help="Write the summary as JSON here.")
@click.option("--examples-per-epoch", default=None, type=int, help="For the epoch column of the log.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
# --- devices and towers (services/worker/devices.py, towers.py) ---
@click.option("--device", default=None, help="Device of the layers, a TF device string (/gpu:0, /cpu:0, "
              "/job:worker/task:1/gpu:0). Default: /gpu:0 if CuPy sees a GPU, else /cpu:0.")
@click.option("--placement-function", default=None, help="'module:function' called per layer; returns its device.")
@click.option("--allow-soft-placement", is_flag=True, help="Run a layer on the CPU when its device has no kernel.")
@click.option("--log-device-placement", is_flag=True, help="Log the device of every layer's ops.")
@click.option("--gpu-memory-fraction", default=None, type=click.FloatRange(0, 1, min_open=True),
              help="Limit CuPy's memory pool to this fraction of each GPU.")
@click.option("--towers", default=1, type=click.IntRange(min=1),
              help="Split each batch over N towers (GPUs, or CPU threads) and average before one push.")
# --- end devices and towers ---
@click.option("--serve", "serve_checkpoint", default=None, type=click.Path(file_okay=False),
              help="Serve mode: answer predict requests from the latest checkpoint in this directory instead of "
                   "training (the same as `zmqflow serve --checkpoint DIR`).")
@click.option("--bind", default="tcp://127.0.0.1:5700", help="With --serve: the endpoint to listen on.")
@click.option("--ready-file", default=None, type=click.Path(dir_okay=False),
              help="With --serve: write the bound endpoint here once serving.")
@ops_options
def command(ps_endpoints, broker, queue_name, container, preloaded, epochs, task_index, num_workers, model_spec, placement_strategy,
            max_shard_bytes, backend, batch_size, dequeue_timeout, mode, bf16, max_steps, log_every, checkpoint_dir,
            checkpoint_every_steps, checkpoint_every_secs, keep_checkpoints, summaries, user_hooks, evaluate,
            shutdown_ps, shutdown_broker, result_file, examples_per_epoch, log_level,
            device, placement_function, allow_soft_placement, log_device_placement, gpu_memory_fraction, towers,
            summary_dir, summary_every_steps, serve_checkpoint, bind, ready_file):
    """Train: dequeue mini-batches from the broker, pull parameters, push gradients.

    Task 0 (or the chief job of TF_CONFIG) is the chief: it initializes or
    restores the variables, checkpoints, and evaluates at the end.

    Exit codes: 0 training ended; 3 a peer was lost (a ps shard or the broker
    unreachable past its timeout, or the input pipeline lost a reader); 1 any
    other error; 2 bad options.

    With --serve DIR the worker trains nothing: it is a model server over the
    latest checkpoint in DIR (see `zmqflow serve --help` for batching options).
    """
    if serve_checkpoint:
        from zmqflow.services.serve.cli import command as serve_command
        args = ["--checkpoint", serve_checkpoint, "--bind", bind, "--backend", backend, "--log-level", log_level]
        args += ["--ready-file", ready_file] if ready_file else []
        args += ["--model", model_spec] if model_spec else []
        return serve_command.main(args=args, prog_name="zmqflow worker --serve", standalone_mode=True)
    from zmqflow.common import queues
    from zmqflow.inputs.datasets import mnist_split
    from zmqflow.models.registry import model_variables
    from zmqflow.common.placement import place
    from zmqflow.common.ps_client import PsClient
    from zmqflow.services.worker import hooks as H
    from zmqflow.services.worker.trainer import Trainer

    tf_task = task_from_tf_config(("worker", "chief", "master"))
    if tf_task is not None:
        cluster = tf_task.cluster
        ps_endpoints = ps_endpoints or [cluster.endpoint("ps", i) for i in cluster.task_indices("ps")]
        chiefs = [j for j in ("chief", "master") if j in cluster.jobs]
        offset = cluster.num_tasks(chiefs[0]) if chiefs else 0
        if task_index is None:
            task_index = tf_task.task_index + (offset if tf_task.task_type == "worker" else 0)
        if num_workers is None:
            num_workers = offset + (cluster.num_tasks("worker") if "worker" in cluster.jobs else 0)
    task_index, num_workers = task_index or 0, num_workers or 1
    if not ps_endpoints:
        raise click.UsageError("no ps shards: pass --ps (one per shard) or set TF_CONFIG")
    setup_logging(log_level, f"worker:{task_index}")
    keep_freed_memory()
    is_chief = task_index == 0
    spec = resolve_model(model_spec)
    # --- devices and towers: the model with its layers placed (services/worker/devices.py) ---
    from zmqflow.common.errors import InvalidArgumentError
    from zmqflow.services.worker.devices import build_model
    try:
        model = build_model(spec, backend=backend, device=device, placement_function=placement_function,
                            allow_soft_placement=allow_soft_placement, log_device_placement=log_device_placement,
                            gpu_memory_fraction=gpu_memory_fraction, towers=towers,
                            job=tf_task.task_type if tf_task else "worker",
                            task=tf_task.task_index if tf_task else task_index)
    except InvalidArgumentError as exc:
        raise click.ClickException(f"InvalidArgumentError: {exc}") from None
    # --- end devices and towers ---
    placement = place(model_variables(spec), len(ps_endpoints), placement_strategy, max_shard_bytes)
    if is_chief:
        logging.getLogger("worker").info("placement over %d ps shards:\n%s", len(ps_endpoints), placement.table())
    ps = PsClient(ps_endpoints, placement, bf16=bf16, name=f"worker{task_index}")
    if preloaded:
        from zmqflow.services.worker.preloaded_input import PreloadedInput
        queue = PreloadedInput(ps, preloaded, ps.preloaded_rows(preloaded), epochs, batch_size, task_index,
                               num_workers)
    elif broker:
        try:
            queue = queues.attach(queue_name, container=container, broker=broker, timeout=120.0)
        except OpError as exc:
            _exit_on_error(task_index, exc)
    else:
        raise click.UsageError("no input: pass --broker (and --queue) or --preloaded")
    hooks = [H.LoggingHook(log_every)]
    if max_steps:
        hooks.append(H.StopAtStepHook(max_steps))
    if is_chief and checkpoint_dir:
        hooks.append(H.CheckpointHook(checkpoint_dir, checkpoint_every_steps, checkpoint_every_secs, keep_checkpoints))
    if is_chief and summaries:
        hooks.append(H.SummaryHook(summaries))
    hooks += [H.load_hook(h) for h in user_hooks]
    from zmqflow.common import metrics
    if metrics.serve_requested():  # --metrics-port
        from zmqflow.services.worker.metrics_hook import MetricsHook
        hooks.append(MetricsHook(f"worker:{task_index}"))
    summary_dir = summary_dir or (os.path.join(checkpoint_dir, "train") if checkpoint_dir else None)
    tensorboard = None
    if is_chief and summary_dir and summary_dir != "off":
        from zmqflow.services.worker.tensorboard import TensorBoardHook
        tensorboard = TensorBoardHook(summary_dir, summary_every_steps)
        hooks.append(tensorboard)
    trainer = Trainer(model, ps, queue, replica=task_index, num_workers=num_workers, is_chief=is_chief,
                      batch_size=batch_size, mode=mode, hooks=hooks, checkpoint_dir=checkpoint_dir,
                      examples_per_epoch=examples_per_epoch, dequeue_timeout=dequeue_timeout, container=container,
                      config={"model": spec, "backend": backend})
    try:
        summary = trainer.run()
    except OpError as exc:  # a peer we cannot do without is gone: say which, exit non-zero
        _exit_on_error(task_index, exc)
    if is_chief and evaluate:
        _, (test_x, test_y) = mnist_split()
        summary["test_accuracy"] = trainer.evaluate(test_x, test_y)
        logging.getLogger("worker").info("test accuracy: %.4f", summary["test_accuracy"])
        if tensorboard is not None:
            tensorboard.add_scalar("accuracy", summary["test_accuracy"], summary["global_step"])
    if tensorboard is not None:
        tensorboard.close()
    if is_chief and shutdown_ps:
        ps.shutdown()
    if is_chief and shutdown_broker and broker:
        _shutdown_broker(broker)
    ps.close()
    if result_file:
        tmp = result_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, result_file)


def _exit_on_error(task_index, exc):
    """Name the failing peer and exit: PEER_LOST when a service is unreachable or the input pipeline
    lost a reader, 1 for any other error."""
    from zmqflow.common.errors import AbortedError, UnavailableError
    logging.getLogger("worker").error("worker %d stops: %s: %s", task_index, type(exc).__name__, exc)
    raise SystemExit(PEER_LOST if isinstance(exc, (UnavailableError, AbortedError)) else 1) from None


def _shutdown_broker(broker):
    """Ask the broker to exit; one that is already gone is no error at the end of a job."""
    from zmqflow.common.broker_client import BrokerClient
    try:
        with BrokerClient(broker, heartbeat_interval=5.0) as client:
            client.shutdown(by="the chief")
    except OpError as exc:
        logging.getLogger("worker").warning("broker shutdown: %s: %s", type(exc).__name__, exc)


def main():
    command(auto_envvar_prefix="ZMQFLOW_WORKER")


if __name__ == "__main__":
    main()
