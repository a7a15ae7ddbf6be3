"""Client of an aggregator: `AggregatorClient(address).predict(x) -> (probabilities, info)`.

`info` says which members answered and why the others did not (timeout, error, unhealthy, busy).
A request the members are too busy to answer by its deadline is shed at once:
ResourceExhaustedError, whose `retry_after` is the aggregator's hint (seconds) for a retry.
The request's deadline travels twice: as `deadline_ms` (the aggregator answers AT it with
what arrived) and as the RPC deadline, so the client waits no longer than it must.
Like RpcClient, one client belongs to one thread.
"""

import time

from zmqflow.common.wire.protocol import AggregatorOps
from zmqflow.common.rpc.client import OpClient
from zmqflow.common.clients.serve import PendingPredict, records_args, request_tensors


class AggregatorClient(OpClient):
    def __init__(self, address, timeout=30.0, name="aggregator-client", **rpc_options):
        super().__init__(address, timeout, name, **rpc_options)

    def predict_async(self, x, deadline_ms=None, min_members=None, combine=None, mode=None, records=None):
        """`x`: one array or {input name: array}; or `records` {column: [values]} instead (x None)."""
        names, tensors = (None, []) if records is not None else request_tensors(x)
        # sent_at: the aggregator tells from it how long the request waited to be read
        request = AggregatorOps.Predict(names, records and records_args(records), deadline_ms, min_members, combine,
                                        mode, sent_at=time.time())
        timeout = self.rpc.default_timeout if deadline_ms is None else deadline_ms / 1000.0
        return PendingPredict(self.rpc.submit(request, tensors=tensors, timeout=timeout))

    def predict(self, x, deadline_ms=None, min_members=None, combine=None, mode=None):
        """(probabilities [n, classes] float32, info); DeadlineExceededError when too few members answered;
        ResourceExhaustedError at once when the aggregator is overloaded (its `retry_after`: seconds to wait)."""
        return self.predict_async(x, deadline_ms, min_members, combine, mode).result()

    def predict_records(self, records, deadline_ms=None, min_members=None, combine=None, mode=None):
        """(outputs, info) for raw feature columns {column: [values]} (members trained with --data)."""
        return self.predict_async(None, deadline_ms, min_members, combine, mode, records).result()

    def members(self, timeout=5.0):
        """One dict per member: address, weight, healthy, outstanding, requests, answers, timeouts, errors, ..."""
        return self.rpc.call(AggregatorOps.Members(), timeout=timeout)[0]["members"]

    def model_info(self, timeout=5.0):
        """{"schema": the members' inputs, output and raw feature columns}: a healthy member's model_info, relayed
        by the aggregator, so a client that reaches only the aggregator's address learns what it takes."""
        return self.rpc.call(AggregatorOps.ModelInfo(), timeout=timeout)[0]

    def add_member(self, address, weight=1.0, timeout=5.0):
        return self.rpc.call(AggregatorOps.AddMember(address, weight), timeout=timeout)[0]["member"]

    def remove_member(self, address, timeout=5.0):
        return self.rpc.call(AggregatorOps.RemoveMember(address), timeout=timeout)[0]["member"]

    def stats(self, timeout=5.0):
        return self.rpc.call(AggregatorOps.Stats(), timeout=timeout)[0]
