"""`zmqflow`: one command for every service and the operator tools."""

import click

from bench.cli import bench
from services.aggregator.cli import command as aggregator
from services.broker.cli import command as broker
from services.cluster_command import cluster
from services.data_command import data
from services.devices_command import devices
from services.keys_command import keys
from services.operator_commands import ping, queues
from services.placement_command import placement
from services.ps.cli import command as ps
from services.reader.cli import command as reader
from loadtest.aggregator import command as loadtest
from services.ensemble.cli import command as ensemble
from services.serve.cli import command as serve
from services.status.command import command as status
from services.sweep.cli import command as sweep
from services.train import command as train
from services.up.cli import command as up
from services.worker.cli import command as worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """zmqflow: TensorFlow 1.x style distributed training and ensemble serving as services over ZeroMQ."""


main.add_command(broker)
main.add_command(ps)
main.add_command(worker)
main.add_command(train)
main.add_command(sweep)
main.add_command(ensemble)
main.add_command(loadtest)
main.add_command(ping)
main.add_command(queues)
main.add_command(bench)
main.add_command(placement)
main.add_command(reader)
main.add_command(devices)
main.add_command(serve)
main.add_command(aggregator)
main.add_command(up)
main.add_command(cluster)
main.add_command(keys)
main.add_command(status)
main.add_command(data)


@main.command()
@click.option("--queue-tour/--no-queue-tour", default=True, show_default=True,
              help="Start with a short tour of the queue-broker (MNIST through a shuffle queue).")
@click.option("--epochs", default=10, show_default=True, type=click.IntRange(1), help="Epochs of the main training.")
@click.option("--sweep-epochs", default=3, show_default=True, type=click.IntRange(1), help="Epochs of each sweep run.")
@click.option("--load-seconds", default=4.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Length of the load test (a member is killed half-way).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where checkpoints, the sweep and logs go (default: a new temporary directory).")
def demo(queue_tour, epochs, sweep_epochs, load_seconds, work_dir):
    """Run the demo (what `make demo` runs): train with 2 ps + 2 workers, sweep, serve the best
    three as an ensemble, load-test it with a member killed half-way, and summarize."""
    from services.demo import run_demo
    from services.demo_story import run_story
    if queue_tour:
        run_demo()
    run_story(work_dir=work_dir, epochs=epochs, sweep_epochs=sweep_epochs, load_seconds=load_seconds)
