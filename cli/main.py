"""`zmqflow`: one command for every service and the operator tools.

Subcommands are imported when they run, not when `zmqflow` starts: a container's healthcheck
(`zmqflow ping`, `zmqflow healthcheck`, every few seconds in every container) then pays for its
own imports only, not for the worker's kernels and every other command's.
"""

import importlib

import click

from zmqflow.common.errors import InvalidArgumentError, OpError
from zmqflow.common.version import __version__

COMMANDS = {
    "broker": "zmqflow.services.broker.cli:command",
    "ps": "zmqflow.services.ps.cli:command",
    "worker": "zmqflow.services.worker.cli:command",
    "train": "zmqflow.cli.train:command",
    "sweep": "zmqflow.cli.sweep:command",
    "ensemble": "zmqflow.cli.ensemble:command",
    "evaluate": "zmqflow.cli.evaluate:command",
    "predict": "zmqflow.cli.predict:command",
    "export": "zmqflow.cli.export:command",
    "loadtest": "zmqflow.loadtest.aggregator:command",
    "ping": "zmqflow.cli.ops:ping",
    "healthcheck": "zmqflow.cli.ops:healthcheck",
    "queues": "zmqflow.cli.ops:queues",
    "bench": "zmqflow.bench.cli:bench",
    "placement": "zmqflow.cli.placement:placement",
    "reader": "zmqflow.services.reader.cli:command",
    "devices": "zmqflow.cli.devices:devices",
    "serve": "zmqflow.services.serve.cli:command",
    "aggregator": "zmqflow.services.aggregator.cli:command",
    "gateway": "zmqflow.services.gateway.cli:command",
    "up": "zmqflow.cli.up:command",
    "logs": "zmqflow.cli.up:logs",       # `zmqflow compose logs`; `zmqflow ps` is the parameter server: compose ps
    "down": "zmqflow.cli.up:down",
    "cluster": "zmqflow.cli.cluster:cluster",
    "keys": "zmqflow.cli.keys:keys",
    "shutdown": "zmqflow.cli.ops:shutdown",
    "k8s": "zmqflow.cli.k8s:k8s",
    "compose": "zmqflow.cli.compose:compose",
    "status": "zmqflow.cli.status:command",
    "data": "zmqflow.cli.data:data",
    "checkpoint": "zmqflow.cli.checkpoint:checkpoint",
    "demo": "zmqflow.cli.demo:demo",
}
"""Subcommand name -> "module:attribute" of its click command."""


class LazyGroup(click.Group):
    """A click group whose subcommands (COMMANDS) are imported on first use."""

    def list_commands(self, ctx):
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            module, _, attribute = COMMANDS[name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if command.name != name:
                raise RuntimeError(f"{COMMANDS[name]} is `{command.name}`, not `{name}`")
            self.add_command(command, name)
        return self.commands.get(name)

    def invoke(self, ctx):
        """An OpError out of any subcommand (bad input, a file that is not what it says, a service's refusal)
        ends it as one line naming its class, as TensorFlow's errors read, not as a traceback: exit 2 for bad
        input (InvalidArgumentError: options, specs, data files), as click's usage errors; 1 otherwise (V6,
        docs/cli.md)."""
        try:
            return super().invoke(ctx)
        except OpError as exc:
            error = click.ClickException(f"{type(exc).__name__}: {exc}")
            if isinstance(exc, InvalidArgumentError):
                error.exit_code = 2
            raise error from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="zmqflow")
def main():
    """zmqflow: TensorFlow 1.x style distributed training and ensemble serving as services over ZeroMQ."""
