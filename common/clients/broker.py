"""Client of a queue-broker's own ops (the queues themselves: common/clients/queues.py, TensorFlow's API)."""

from zmqflow.common.wire.protocol import BrokerOps
from zmqflow.common.rpc.client import OpClient


class BrokerClient(OpClient):
    def __init__(self, address, timeout=5.0, name="broker-client", **rpc_options):
        super().__init__(address, timeout, name, **rpc_options)

    def list_queues(self, timeout=5.0):
        """One dict per queue: handle, container, name, kind, size, capacity, closed, waiting requests."""
        return self.rpc.call(BrokerOps.ListQueues(), timeout=timeout)[0]["queues"]

    def reset(self, container="", timeout=5.0):
        """Free every queue of a container (its pending requests fail)."""
        return self.rpc.call(BrokerOps.Reset(container), timeout=timeout)[0]

    def shutdown(self, by="a client", timeout=5.0):
        """Ask the broker to exit 0 (the chief does at the end of training)."""
        return self.rpc.call(BrokerOps.Shutdown(by), timeout=timeout)[0]
