"""`zmqflow-broker`: run the queue-broker service."""

import click

from common.cli_support import service_options, run_service
from services.broker.server import BrokerService


@click.command(name="broker", context_settings={"show_default": True})
@service_options(default_bind="tcp://127.0.0.1:5555")
def command(bind, ready_file, log_level, client_timeout, max_message_bytes):
    """Host FIFO, random-shuffle and padding queues with TensorFlow's semantics.

    Clients open queues by (container, shared_name) and enqueue / dequeue
    tensors; blocked requests wait in the broker, never in a thread.
    Stops cleanly on SIGTERM or SIGINT.
    """
    run_service(BrokerService, bind, ready_file, log_level, client_timeout, max_message_bytes)


def main():
    command(auto_envvar_prefix="ZMQFLOW_BROKER")


if __name__ == "__main__":
    main()
