"""`zmqflow-broker`: run the queue-broker service."""

import os
import re

import click

from zmqflow.common.processes.service_cli import run_service_instance, service_options
from zmqflow.services.broker.queues.quota import BrokerLimits
from zmqflow.services.broker.server import BrokerService

_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


class ByteSize(click.ParamType):
    """A byte count: 1000000, 512M, 4GiB (0 = unlimited)."""

    name = "bytes"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*([kmgt]i?)?b?\s*", str(value), re.IGNORECASE)
        if not m:
            self.fail(f"{value!r} is not a byte count (e.g. 1000000, 512M, 4GiB)", param, ctx)
        return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def half_the_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (OSError, ValueError):
        return 0


@click.command(name="broker", context_settings={"show_default": True})
@service_options(default_bind="tcp://127.0.0.1:5555")
@click.option("--max-queues", default=10_000, help="Queues the broker holds at most (0 = unlimited).")
@click.option("--max-queues-per-container", default=0, help="Queues one container holds at most (0 = unlimited).")
@click.option("--max-queue-capacity", default=0,
              help="Largest capacity a queue may declare; when set, unbounded queues are refused (0 = unlimited).")
@click.option("--max-container-bytes", type=ByteSize(), default="0",
              help="Element bytes one container's queues may hold, waiting enqueues included (0 = unlimited).")
@click.option("--max-total-bytes", type=ByteSize(), default=None, show_default="half of this machine's memory",
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
    broker_limits = BrokerLimits(max_queues, max_queues_per_container, max_queue_capacity, max_container_bytes,
                                 half_the_memory() if max_total_bytes is None else max_total_bytes)
    run_service_instance("broker:0", BrokerService, broker_limits=broker_limits, **service)  # TF_CONFIG's task name


def main():
    command(auto_envvar_prefix="ZMQFLOW_BROKER")


if __name__ == "__main__":
    main()
