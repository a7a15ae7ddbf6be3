"""The one liveness probe: does the service at an address answer, what is it, and what does it hold.

`zmqflow ping`, `zmqflow status` and `zmqflow cluster check` all ask through here, so
"up" means the same everywhere: a ping answered within `timeout` and an `info` after it.
"""

import dataclasses
import time

from zmqflow.common.errors import OpError
from zmqflow.common.wire.protocol import AggregatorOps, BrokerOps, Ops, PsOps, ServeOps
from zmqflow.common.rpc.client import RpcClient

DETAIL_OPS = {"queue-broker": BrokerOps.ListQueues, "ps-shard": PsOps.Stats, "serve": ServeOps.ModelInfo,
              "aggregator": AggregatorOps.Stats}
"""The request that tells what a service holds, by the `service` its info names."""


@dataclasses.dataclass
class Probe:
    address: str
    up: bool
    rtt_s: float = None        # the ping's round trip
    info: dict = None          # the service's `info`: service, pid, uptime_s, metrics, ...
    detail: dict = None        # with detail=True: the broker's queues, a shard's stats, a server's model, an aggregator's
    #                            stats (its members, counters and latency percentiles)
    error: str = None          # why it is down: the error's class and message
    waited_s: float = None     # how long a failed probe took

    @property
    def rtt_ms(self):
        return None if self.rtt_s is None else round(self.rtt_s * 1000, 3)


def endpoint_of(address):
    """A ZeroMQ endpoint from `host:port` or `tcp://host:port`."""
    address = address.strip()
    return address if "://" in address else f"tcp://{address}"


def probe(address, timeout=2.0, detail=False, name="probe"):
    """Ask the service at `address` (host:port or an endpoint); never raises for a service that is down."""
    address = endpoint_of(address)
    started = time.perf_counter()
    try:
        with RpcClient(address, heartbeat_interval=timeout, heartbeat_liveness=1, name=name) as client:
            rtt = client.ping(timeout=timeout)
            info, _ = client.call(Ops.Info(), timeout=timeout)
            result = Probe(address, True, rtt, info)
            request = DETAIL_OPS.get(info.get("service")) if detail else None
            if request:
                result.detail, _ = client.call(request(), timeout=timeout)
            return result
    except OpError as exc:
        return Probe(address, False, error=f"{type(exc).__name__}: {exc}",
                     waited_s=round(time.perf_counter() - started, 2))
