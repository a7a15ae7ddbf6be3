"""`zmqflow-ps`: run one parameter-server shard."""

import json
import logging

import click

from zmqflow.common.processes.service_cli import (option, run_service_instance, service_main, service_options,
                                                  task_config_option)
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.models.spec import resolve_model
from zmqflow.common.optimizers import DEFAULT_OPTIMIZER
from zmqflow.models.registry import model_variables
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.task_options import model_options, parse_json_option, task_from_tf_config


@click.command(name="ps", context_settings={"show_default": True})
@task_config_option()
@service_options(default_bind="127.0.0.1:5600")
@click.option("--task-index", default=None, type=int, help="This shard's index (default: TF_CONFIG, else 0).")
@click.option("--num-ps", default=None, type=int, help="Number of ps shards (default: TF_CONFIG, else 1).")
@model_options
@click.option("--optimizer", default=json.dumps(DEFAULT_OPTIMIZER),
              help='Optimizer as JSON: kind sgd|momentum|adam|adagrad, learning_rate (number or schedule).')
@click.option("--mode", default="async", type=click.Choice(["async", "sync"]))
@click.option("--replicas-to-aggregate", default=None, type=int, help="Sync: gradients averaged per step.")
@click.option("--total-num-replicas", default=None, type=int, help="Sync: workers in all (spares allowed).")
@click.option("--elastic", is_flag=True,
              help="Sync: workers join and leave while training (Horovod's elastic mode): each step aggregates "
                   "the gradients of every member of that step; a worker joining is admitted at the next step, one "
                   "leaving (done, or lost after --lost-after-secs) is no longer waited for. Not with "
                   "--replicas-to-aggregate or --total-num-replicas.")
@click.option("--min-replicas", default=1, type=click.IntRange(min=1),
              help="Elastic: steps wait while fewer workers are members (Horovod's min_np).")
@click.option("--max-replicas", default=None, type=click.IntRange(min=1), show_default="no limit",
              help="Elastic: the replica indices that may join are 0..N-1 (Horovod's max_np).")
@click.option("--staleness-bound", default=None, type=int, help="Async: drop pushes staler than this.")
@click.option("--staleness-scaling", is_flag=True, help="Async: scale gradients by 1/(1+staleness).")
@click.option("--warmup-steps", default=0, help="Async: accept pushes from one replica only for these steps.")
@click.option("--nonfinite", default="skip", type=click.Choice(["skip", "refuse"]),
              help="A push holding NaN or Inf never reaches the variables: skip it (counted in "
                   "zmqflow_ps_pushes_dropped{reason=\"nonfinite\"}; sync steps go on without it) or refuse it "
                   "with INVALID_ARGUMENT, failing the worker that sent it.")
@option("--lost-after-secs", "lost_after", old_names=["--lost-after"], default=5.0, type=click.FloatRange(min=0),
        help="Sync: a replica the current step misses that has said nothing (no push, request or heartbeat) "
             "for this many seconds is lost (0: never).")
@click.option("--lost-policy", default="continue", type=click.Choice(["continue", "abort"]),
              help="Sync, a lost replica: go on without it (steps need one replica fewer; it rejoins when heard "
                   "from) or fail every waiting pull with ABORTED naming it, ending the workers.")
@click.option("--restore-from", default=None, type=click.Path(file_okay=False),
              help="Restore this shard's share of the latest checkpoint here at start (a restarted shard).")
@click.option("--checkpoint-root", default=None, type=click.Path(file_okay=False),
              show_default="--restore-from, else the current directory",
              help="`save` writes checkpoints only in this directory and below it, never through a symbolic link.")
@click.option("--max-preload-bytes", type=click.IntRange(min=0), default=None, show_default="1 GiB",
              help="Bytes of preloaded data sets this shard holds in all; a preload past them is refused.")
@click.option("--max-shared-variable-bytes", type=click.IntRange(min=0), default=None, show_default="1 GiB",
              help="Bytes of shared variables (clients' session.variable, in containers) this shard holds in all, "
                   "256 more per variable; a create past them is refused (RESOURCE_EXHAUSTED).")
def command(task_index, num_ps, model_spec, placement_strategy, max_shard_bytes, optimizer, mode, replicas_to_aggregate,
            total_num_replicas, elastic, min_replicas, max_replicas, staleness_bound, staleness_scaling, warmup_steps,
            nonfinite, lost_after, lost_policy,
            restore_from, checkpoint_root, max_preload_bytes, max_shared_variable_bytes, **service):
    """Hold a share of the model's variables and apply the workers' gradients.

    The placement is computed from the model's variable list, the same on every
    task. With TF_CONFIG set (task type ps), the index, the number of shards and
    the address come from it.
    """
    from zmqflow.services.ps.server import PsService

    tf_task = task_from_tf_config(("ps",))
    if tf_task is not None:
        task_index = tf_task.task_index if task_index is None else task_index
        num_ps = tf_task.cluster.num_tasks("ps") if num_ps is None else num_ps
        host, port = tf_task.cluster.task_address("ps", task_index).rsplit(":", 1)
        # a spec naming another host is the "told otherwise" case: every interface of the pod or container
        # (README, Security); a loopback host keeps the loopback default
        service["bind"] = f"tcp://{host if host in ('127.0.0.1', 'localhost') else '*'}:{port}"
    task_index, num_ps = task_index or 0, num_ps or 1
    try:   # a model or placement that cannot be: a bad option, exit 2 (V6)
        variables = model_variables(resolve_model(model_spec))
        placement = place(variables, num_ps, placement_strategy, max_shard_bytes)
    except (InvalidArgumentError, NotFoundError) as exc:
        raise click.UsageError(f"{type(exc).__name__}: {exc}") from None
    pieces = {p.key: p for p in placement.for_shard(task_index)}
    state_options = {"optimizer": parse_json_option(optimizer, "--optimizer"), "mode": mode,
                     "replicas_to_aggregate": replicas_to_aggregate, "total_num_replicas": total_num_replicas,
                     "staleness_bound": staleness_bound, "staleness_scaling": staleness_scaling,
                     "warmup_steps": warmup_steps, "nonfinite": nonfinite}
    if elastic:
        state_options.update(elastic=True, min_replicas=min_replicas, max_replicas=max_replicas)
    elif (min_replicas, max_replicas) != (1, None):
        raise click.UsageError("--min-replicas and --max-replicas apply to an elastic sync job: add --elastic")

    def start_shard(*args, **options):
        shard = PsService(*args, **options)
        log = logging.getLogger("ps-shard")
        log.info("ps:%d of %d, %s mode, placement:\n%s", task_index, num_ps, mode, placement.table())
        if restore_from:
            from zmqflow.common.checkpoints import checkpoint
            if checkpoint.latest_checkpoint(restore_from):
                shard.restore_latest(restore_from)
        return shard

    run_service_instance(f"ps:{task_index}", start_shard, task_index, pieces, state_options,
                         lost_after=lost_after or None, lost_policy=lost_policy,
                         trainable={v.name for v in variables if v.trainable},
                         checkpoint_root=checkpoint_root or restore_from, num_shards=num_ps,
                         **({} if max_shared_variable_bytes is None
                            else {"max_shared_variable_bytes": max_shared_variable_bytes}),
                         **({} if max_preload_bytes is None else {"max_preload_bytes": max_preload_bytes}), **service)


def main():
    service_main(command)


if __name__ == "__main__":
    main()
