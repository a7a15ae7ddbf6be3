"""Client of a model server: `ModelClient(address).predict(x) -> (probabilities, info)`.

`x` is one array, or {input name: array} for a model of several inputs; `predict_records`
sends raw feature columns instead ({column: [values]}, for a model trained with --data) and
its info's `predicted` names the classes. `model_info()["schema"]` says what the model takes.

A thin layer over RpcClient so callers (aggregator, load tests, benchmarks) need not know
the op name or the tensor layout. Like RpcClient, one client belongs to one thread.
"""

import numpy as np

from zmqflow.common.wire.protocol import ServeOps
from zmqflow.common.rpc.client import USE_DEFAULT, OpClient


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
        names, tensors = request_tensors(x)
        return PendingPredict(self.rpc.submit(ServeOps.Predict(names), tensors=tensors, timeout=timeout))

    def predict(self, x, timeout=USE_DEFAULT):
        return self.predict_async(x, timeout).result()

    def predict_records(self, records, timeout=USE_DEFAULT):
        """(outputs, info) for raw feature columns {column: [values]}; info["predicted"] per row."""
        return PendingPredict(self.rpc.submit(ServeOps.Predict(records=records_args(records)),
                                              timeout=timeout)).result()

    def model_info(self, timeout=5.0):
        return self.rpc.call(ServeOps.ModelInfo(), timeout=timeout)[0]


def request_tensors(x):
    """(input names or None, tensors) of a predict: one array as it is (floats as float32), or named arrays."""
    if isinstance(x, dict):
        names = list(x)
        return names, [_contiguous(x[name]) for name in names]
    return None, [_contiguous(x)]


def _contiguous(x):
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=np.float32 if x.dtype.kind in "fb" else None)


def records_args(records):
    """Columns as plain lists (numpy values become Python ones), as the wire's msgpack carries them."""
    return {str(column): np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values)
            for column, values in records.items()}
