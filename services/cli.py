"""`zmqflow`: one command for every service and the operator tools."""

import click

from bench.cli import bench
from services.broker.cli import command as broker
from services.operator_commands import ping, queues


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """zmqflow: TensorFlow 1.x style distributed training as services over ZeroMQ."""


main.add_command(broker)
main.add_command(ping)
main.add_command(queues)
main.add_command(bench)


@main.command()
def demo():
    """Run the demo: MNIST through a real broker (what `make demo` runs)."""
    from services.demo import run_demo
    run_demo()
