"""`zmqflow-broker`: run the queue-broker service."""

import logging

import click

from zmqflow.common.processes.service_cli import ByteSize, run_service_instance, service_main, service_options
from zmqflow.services.broker.queues.quota import BrokerLimits, default_max_total_bytes
from zmqflow.services.broker.server import BrokerService

@click.command(name="broker", context_settings={"show_default": True})
@service_options(default_bind="127.0.0.1:5555")
@click.option("--max-queues", default=10_000, help="Queues the broker holds at most (0 = unlimited).")
@click.option("--max-queues-per-container", default=0, help="Queues one container holds at most (0 = unlimited).")
@click.option("--max-queue-capacity", default=0,
              help="Largest capacity a queue may declare; when set, unbounded queues are refused (0 = unlimited).")
@click.option("--max-container-bytes", type=ByteSize(), default="0",
              help="Element bytes one container's queues may hold, waiting enqueues included (0 = unlimited).")
@click.option("--max-total-bytes", type=ByteSize(), default=None, show_default="half the memory limit of this container's cgroup, else of this machine",
              help="Element bytes all queues together may hold (0 = unlimited).")
def command(max_queues, max_queues_per_container, max_queue_capacity, max_container_bytes, max_total_bytes,
            **service):
    """Host FIFO, random-shuffle and padding queues with TensorFlow's semantics.

    Clients open queues by (container, shared_name) and enqueue / dequeue
    tensors; blocked requests wait in the broker, never in a thread.
    A dequeue with a lease (at least once, docs/queues.md) keeps its elements
    here until acked; they go back to the queue when the lease expires or
    the client is gone. A request over a --max-* limit is refused with RESOURCE_EXHAUSTED naming
    the limit. Stops cleanly on SIGTERM or SIGINT.
    """
    for name, value in (("--max-queues", max_queues), ("--max-queues-per-container", max_queues_per_container),
                        ("--max-queue-capacity", max_queue_capacity)):
        if value < 0:
            raise click.BadParameter(f"{value} < 0 (0 means unlimited)", param_hint=name)
    derivation = None
    if max_total_bytes is None:
        max_total_bytes, derivation = default_max_total_bytes()
    broker_limits = BrokerLimits(max_queues, max_queues_per_container, max_queue_capacity, max_container_bytes,
                                 max_total_bytes)

    def make_broker(*args, **options):
        if derivation:
            logging.getLogger(BrokerService.name).info("--max-total-bytes %d: %s", max_total_bytes, derivation)
        return BrokerService(*args, **options)
    run_service_instance("broker:0", make_broker, broker_limits=broker_limits, **service)  # TF_CONFIG's task name


def main():
    service_main(command)


if __name__ == "__main__":
    main()
