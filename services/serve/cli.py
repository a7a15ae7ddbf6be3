"""`zmqflow serve` / `zmqflow-serve`: run one model server."""

import click

from zmqflow.common.processes.service_cli import BadInput, option, run_service_instance, service_main, service_options
from zmqflow.common.processes.task_options import model_options, trust_checkpoint_code_option
from zmqflow.models.kernels import BACKENDS, DEFAULT_BACKEND


@click.command(name="serve", context_settings={"show_default": True})
@service_options(default_bind="127.0.0.1:5700")
@click.option("--checkpoint", "checkpoint_dir", default=None, type=click.Path(file_okay=False),
              help="Serve the latest checkpoint in this directory.")
@option("--ps", "follow_ps", old_names=["--follow-ps"], multiple=True,
        help="Instead, pull from these ps shard endpoints (repeat, or comma-separated; shard order).")
@click.option("--refresh-secs", default=None, type=float,
              help="Reload parameters this often (newer checkpoint or ps version). Default: 5 with --ps.")
@model_options
@trust_checkpoint_code_option
@click.option("--backend", default=DEFAULT_BACKEND, type=click.Choice(BACKENDS))
@click.option("--max-batch", default=256, help="Most rows run together in one batch.")
@option("--max-delay-secs", "max_delay_secs", old_names=["--max-delay-ms"], old_scale={"--max-delay-ms": 0.001},
        default=0.002, type=click.FloatRange(min=0), help="Longest a request waits for others to join its batch.")
@option("--model-name", "model_name", old_names=["--name"],
        default=None, help="Model name in replies (default: the checkpoint directory's).")
@click.option("--data", "data_spec", default=None,
              help="A data spec (YAML) whose raw feature columns requests may send as records, made into inputs with "
                   "its train split's statistics. Default: the spec the checkpoint records (trained with --data).")
def command(checkpoint_dir, follow_ps, refresh_secs, model_spec, placement_strategy, max_shard_bytes,
            trust_checkpoint_code, backend, max_batch, max_delay_secs, model_name, data_spec, **service):
    """Answer predict requests from a checkpoint or the live ps shards, batching concurrent requests.

    A request sends the model's inputs as tensors (their names, shapes and dtypes are the model's
    input signature, reported by model_info) or, for a model trained with --data, the raw feature
    columns as records; its answer then names the predicted classes."""
    from zmqflow.services.serve.server import ModelServer, default_model_name

    endpoints = [e for item in follow_ps for e in item.split(",") if e]
    if not checkpoint_dir and not endpoints:
        raise click.UsageError("give --checkpoint DIR or --ps ENDPOINT")
    if refresh_secs is None and endpoints:
        refresh_secs = 5.0
    from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
    from zmqflow.common.errors import OpError, PermissionDeniedError
    from zmqflow.models.saved import model_spec_of
    try:
        spec = model_spec_of(Checkpoint(find_checkpoint(checkpoint_dir)) if checkpoint_dir else None, model_spec,
                             trust_checkpoint_code)
    except PermissionDeniedError as exc:   # it names code not trusted: refused, exit 1 as evaluate and predict do
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    except OpError as exc:   # a checkpoint that is not there or malformed: bad input, exit 2 (V6)
        raise BadInput(f"{type(exc).__name__}: {exc}") from None
    data_config = None
    if data_spec:
        from zmqflow.inputs.data_spec import fit, load_spec, load_tables, to_config
        try:
            data = load_spec(data_spec)
            fit(data, load_tables(data)["train"])
            data_config = to_config(data)
        except OpError as exc:   # a data spec or data file that cannot be: bad input, exit 2 (V6)
            raise BadInput(f"{type(exc).__name__}: {exc}") from None
    run_service_instance("serve", ModelServer, spec, backend=backend, max_batch=max_batch, max_delay_ms=max_delay_secs * 1000,
                         model_name=model_name or default_model_name(checkpoint_dir, endpoints),
                         checkpoint_dir=checkpoint_dir, ps_endpoints=endpoints, placement_strategy=placement_strategy,
                         max_shard_bytes=max_shard_bytes, refresh_secs=refresh_secs, data_config=data_config, **service)


def main():
    service_main(command)


if __name__ == "__main__":
    main()
