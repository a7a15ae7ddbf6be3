"""`zmqflow-worker`: one training worker (task 0 is the chief)."""

import click

from zmqflow.common.rpc import health
from zmqflow.common.processes.service_cli import (TASK_CONFIG, BadInput, bind_option, curve_option, ops_options,
                                                  option, profiled, service_main, setup_logging, task_config_option)
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.memory import keep_freed_memory, one_arena
from zmqflow.common.processes.task_options import model_options
from zmqflow.models.kernels import BACKENDS, DEFAULT_BACKEND
from zmqflow.services.worker.config import CONFIG_ONLY, UsageError, WorkerConfig


@click.command(name="worker", context_settings={"show_default": True})
@task_config_option(extra_fields=CONFIG_ONLY)
@curve_option("Keys for CURVE: as a client, checks the ps, broker and peers against DIR/server.key; "
              "with --serve, also encrypts and accepts only the clients in DIR/authorized/")
@click.option("--ps", "ps_endpoints", multiple=True, help="A ps shard endpoint, in shard order (repeat); "
              "default: the ps job of TF_CONFIG.")
@click.option("--broker", default=None, envvar="ZMQFLOW_BROKER", help="The queue-broker endpoint.")
@click.option("--queue", "queue_name", default="train", help="shared_name of the instance queue to train from.")
@click.option("--preloaded", default=None, help="Train from this data set preloaded on ps 0 (sliced by row) "
              "instead of a broker queue.")
@click.option("--epochs", default=1, help="With --preloaded: passes over the data set.")
@click.option("--task-index", default=None, type=int, help="Worker index (default: TF_CONFIG, else 0).")
@click.option("--num-workers", default=None, type=int, help="Workers in the job (default: TF_CONFIG, else 1).")
@model_options
@click.option("--backend", default=DEFAULT_BACKEND, type=click.Choice(BACKENDS),
              help="Kernels: numba (CPU), numpy (reference) or cupy (GPU).")
@click.option("--batch-size", default=100)
@option("--dequeue-timeout-secs", "dequeue_timeout", old_names=["--dequeue-timeout"],
        default=600.0, help="Seconds to wait for a mini-batch before giving up "
        "(the error names the queue).")
@click.option("--at-least-once", is_flag=True, help="Dequeue each batch with a lease and ack it only once the "
              "step's gradients were acknowledged by the ps: a worker that dies mid-step gives its batches back to "
              "the queue for the others (at least once, never lost; a little slower). Broker queues only: not with "
              "--preloaded. See docs/queues.md.")
@option("--batch-lease-secs", "lease", old_names=["--lease"],
        default=None, type=click.FloatRange(0, 3600, min_open=True),
        help="With --at-least-once: seconds a batch is leased for, extended while held. Default: 30 s, or "
             "20 times the slowest step when longer.")
@click.option("--mode", default="async", type=click.Choice(["async", "sync", "allreduce"]),
              help="async or sync: must match the ps shards. allreduce: no ps; the workers average their gradients "
                   "over a ring among themselves and each applies --optimizer to its own replica.")
@click.option("--optimizer", default=None, show_default="the ps's default",
              help="With --mode allreduce: the update rule every worker applies, JSON as the ps's --optimizer.")
@click.option("--chief", default=None, help="With --mode allreduce, workers 1..n-1: the endpoint the chief listens "
              "on for the ring (its --bind). Default: TF_CONFIG's chief (or worker 0).")
@click.option("--lost-after-secs", "lost_after", default=5.0, type=click.FloatRange(min=0, min_open=True),
              help="With --mode allreduce: a worker silent (no chunk, no heartbeat) this many seconds is lost.")
@click.option("--lost-policy", default="continue", type=click.Choice(["continue", "abort"]),
              help="With --mode allreduce, a lost worker: the chief re-forms the ring without it and training goes "
                   "on, or every worker stops naming it. A lost chief always ends the job.")
@click.option("--bf16", is_flag=True, help="Send pulls and pushes as bfloat16.")
@click.option("--max-steps", default=None, type=int, help="Stop at this global step (StopAtStepHook).")
@click.option("--log-every", default=100, help="Log a line every N steps.")
@click.option("--checkpoint-dir", default=None, type=click.Path(file_okay=False),
              help="Chief: restore from / save checkpoints here.")
@click.option("--checkpoint-every-steps", default=None, type=int)
@click.option("--checkpoint-every-secs", default=None, type=float)
@click.option("--keep-checkpoints", default=5)
@click.option("--summary-dir", default=None, type=click.Path(file_okay=False),
              help="Chief: TensorBoard event files here (loss, examples/s, staleness, accuracy). "
                   "Default: CHECKPOINT_DIR/train with --checkpoint-dir, else none; 'off' for none.")
@click.option("--summary-every-steps", default=50, type=click.IntRange(min=1), help="Chief: steps between summaries.")
@click.option("--hook", "user_hooks", multiple=True, help="A user hook 'module:Class' (repeat).")
@click.option("--evaluate", is_flag=True, help="Chief: at the end, report the task's metrics on the test split of "
              "--data-config's data spec (default: the shipped MNIST sample).")
@click.option("--shutdown-ps", is_flag=True, help="Chief: tell the ps shards to exit when training ends.")
@click.option("--shutdown-broker", is_flag=True, help="Chief: tell the broker to exit when training ends "
              "(every worker is done by then), so the whole job completes with exit 0.")
@option("--json-out", "result_file", old_names=["--result-file"],
        default=None, type=click.Path(dir_okay=False), help="Write the summary as JSON here.")
@click.option("--data-config", default=None, type=click.Path(dir_okay=False),
              help="Chief: a JSON file of the data spec and its train-split statistics, recorded in every checkpoint "
                   "so `zmqflow predict` and `evaluate` transform inputs as training did (zmqflow train writes it).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.option("--device", default=None, help="Device of the layers, a TF device string (/gpu:0, /cpu:0, "
              "/job:worker/task:1/gpu:0). Default: /gpu:0 if CuPy sees a GPU, else /cpu:0.")
@click.option("--placement-function", default=None, help="'module:function' called per layer; returns its device.")
@click.option("--allow-soft-placement", is_flag=True, help="Run a layer on the CPU when its device has no kernel.")
@click.option("--log-device-placement", is_flag=True, help="Log the device of every layer's ops.")
@click.option("--gpu-memory-fraction", default=None, type=click.FloatRange(0, 1, min_open=True),
              help="Limit CuPy's memory pool to this fraction of each GPU.")
@click.option("--towers", default=1, type=click.IntRange(min=1),
              help="Split each batch over N towers (GPUs, or CPU threads) and average before one push.")
@click.option("--in-graph", is_flag=True, help="Be one replica of in-graph replication: listen on --bind and "
              "compute on this worker's device and share of the input when the client asks (docs/design.md).")
@click.option("--replica", "replicas", multiple=True, metavar="ADDRESS",
              help="Be the client of in-graph replication: drive the replica listening at ADDRESS (repeat, one per "
                   "replica; started with --in-graph). --mode sync averages their gradients into one push a step, "
                   "async lets each replica push its own.")
@click.option("--replica-timeout-secs", "replica_timeout", default=60.0, type=click.FloatRange(min=0, min_open=True),
              help="In-graph client: seconds to wait for one replica's step before it is taken for lost.")
@click.option("--serve", "serve_checkpoint", default=None, type=click.Path(file_okay=False),
              help="Serve mode: answer predict requests from the latest checkpoint in this directory instead of "
                   "training (the same as `zmqflow serve --checkpoint DIR`).")
@click.option("--pipeline-next", multiple=True, metavar="[STAGE=]ENDPOINT",
              help="A model whose layers run on several workers (/job:worker/task:N): the endpoint a stage this "
                   "worker's stage sends to listens on (its --bind), as STAGE=ENDPOINT, once for each (a branching "
                   "model's stage feeds several); a plain ENDPOINT is the next stage of a chain. Every stage but "
                   "the output stage needs it.")
@option("--pipeline-timeout-secs", "pipeline_timeout", old_names=["--pipeline-timeout"],
        default=120.0, type=click.FloatRange(min=0, min_open=True),
        help="Pipelined model: seconds to wait for a neighbouring stage before giving up.")
@bind_option("127.0.0.1:5700", help="With --serve or --in-graph, as a pipeline stage after the first, or in an "
             "all-reduce ring: where to listen, [HOST:]PORT or a ZeroMQ URL, as every service's --bind.")
@click.option("--ready-file", default=None, type=click.Path(dir_okay=False),
              help="With --serve or --in-graph, as a later pipeline stage or in an all-reduce ring: write the bound "
                   "endpoint here once listening.")
@ops_options
def command(**options):
    """Train: dequeue mini-batches from the broker, pull parameters, push gradients.

    Task 0 (or the chief job of TF_CONFIG) is the chief: it initializes or
    restores the variables, checkpoints, and evaluates at the end.

    Exit codes: 0 training ended; 3 a peer was lost (a ps shard or the broker
    unreachable past its timeout, or the input pipeline lost a reader); 1 any
    other error; 2 bad options or input (InvalidArgumentError).

    With --serve DIR the worker trains nothing: it is a model server over the
    latest checkpoint in DIR (see `zmqflow serve --help` for batching options).
    """
    if options["serve_checkpoint"]:
        return _serve(**{k: options[k] for k in ("serve_checkpoint", "bind", "backend", "log_level", "ready_file",
                                                 "model_spec")})
    try:
        config = WorkerConfig.from_options(**options, **click.get_current_context().meta.get(TASK_CONFIG, {}))
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    setup_logging(config.log_level, config.name)
    health.announce(health.CLIENT)
    keep_freed_memory()
    if config.towers == 1:
        one_arena()
    from zmqflow.services.worker.build import run
    try:
        profiled(run, config, task=config.name)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except InvalidArgumentError as exc:   # bad options or input found once it runs: exit 2 (V6)
        raise BadInput(f"InvalidArgumentError: {exc}") from None


def _serve(serve_checkpoint, bind, backend, log_level, ready_file, model_spec):
    """Serve mode: the model server over the latest checkpoint (zmqflow serve)."""
    from zmqflow.services.serve.cli import command as serve_command
    args = ["--checkpoint", serve_checkpoint, "--bind", bind, "--backend", backend, "--log-level", log_level]
    args += ["--ready-file", ready_file] if ready_file else []
    args += ["--model", model_spec] if model_spec else []
    return serve_command.main(args=args, prog_name="zmqflow worker --serve", standalone_mode=True)


def main():
    service_main(command)


if __name__ == "__main__":
    main()
