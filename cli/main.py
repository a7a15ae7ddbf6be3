"""`zmqflow`: one command for every service and the operator tools."""

import click

from zmqflow import __version__

from zmqflow.bench.cli import bench
from zmqflow.services.aggregator.cli import command as aggregator
from zmqflow.services.broker.cli import command as broker
from zmqflow.cli.cluster import cluster
from zmqflow.cli.data import data
from zmqflow.cli.demo import demo
from zmqflow.cli.devices import devices
from zmqflow.cli.k8s import k8s
from zmqflow.cli.keys import keys
from zmqflow.cli.ops import healthcheck, ping, queues
from zmqflow.cli.placement import placement
from zmqflow.services.ps.cli import command as ps
from zmqflow.services.reader.cli import command as reader
from zmqflow.loadtest.aggregator import command as loadtest
from zmqflow.cli.ensemble import command as ensemble
from zmqflow.services.serve.cli import command as serve
from zmqflow.cli.status import command as status
from zmqflow.cli.sweep import command as sweep
from zmqflow.cli.train import command as train
from zmqflow.cli.up import command as up
from zmqflow.services.worker.cli import command as worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="zmqflow")
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
main.add_command(healthcheck)
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
main.add_command(k8s)
main.add_command(status)
main.add_command(data)
main.add_command(demo)
