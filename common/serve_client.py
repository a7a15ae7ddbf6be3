"""Client of a model server: `ModelClient(address).predict(x) -> (probabilities, info)`.

A thin layer over RpcClient so callers (aggregator, load tests, benchmarks) need not know
the op name or the tensor layout. Like RpcClient, one client belongs to one thread.
"""

import numpy as np

from zmqflow.common.protocol import ServeOps
from zmqflow.common.rpc_client import USE_DEFAULT, OpClient


class PendingPredict:
    """A predict in flight; `result()` gives (probabilities [n, classes] float32, info dict)."""

    __slots__ = ("call",)

    def __init__(self, call):
        self.call = call

    @property
    def done(self):
        return self.call.done

    def result(self):
        info, tensors = self.call.result()
        return tensors[0], info

    def cancel(self):
        self.call.cancel()


class ModelClient(OpClient):
    def __init__(self, address, timeout=None, name="serve-client", **rpc_options):
        super().__init__(address, timeout, name, **rpc_options)

    def predict_async(self, x, timeout=USE_DEFAULT):
        x = np.ascontiguousarray(x, dtype=np.float32)
        return PendingPredict(self.rpc.submit(ServeOps.PREDICT, {}, [x], timeout=timeout))

    def predict(self, x, timeout=USE_DEFAULT):
        return self.predict_async(x, timeout).result()

    def model_info(self, timeout=5.0):
        return self.rpc.call(ServeOps.MODEL_INFO, timeout=timeout)[0]
