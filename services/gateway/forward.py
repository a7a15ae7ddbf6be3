"""One inference forwarded to the service that answers the model: the aggregator (the ensemble) or a model server.

Why the deadline is sent twice to the aggregator: as its `deadline_ms` argument it answers AT the
deadline with the members that made it, and as the call's timeout the gateway stops waiting just
after (as common/clients/aggregator.py does). The response parameters say which members answered
and why the others did not, by their model names, as the protocol's scalar parameter values.
"""

from zmqflow.common.errors import OpError
from zmqflow.common.wire.protocol import AggregatorOps, ServeOps
from zmqflow.services.gateway.catalog import ENSEMBLE


ENSEMBLE_PARAMETERS = ("min_members", "combine")
"""Request parameters passed on to the aggregator as they are (it checks them: a bad one is its 400)."""


async def infer(upstreams, model, inputs, deadline_ms, default_timeout_s, parameters=None, records=None):
    """(output [n, width] float32, response parameters) of `model` for `inputs` (one array per model input)
    or for raw `records` ({column: [values]}, made into inputs by the model servers); an ensemble takes the
    request's min_members and combine parameters too."""
    if records is not None:
        inputs = []
    names = [spec.name for spec in model.inputs] if len(inputs) > 1 else None
    timeout = default_timeout_s if deadline_ms is None else deadline_ms / 1000.0
    if model.kind != ENSEMBLE:
        _, tensors = await upstreams.get(model.address).call(ServeOps.Predict(names, records), tensors=inputs,
                                                             timeout=timeout)
        return tensors[0], {}
    chosen = {key: parameters[key] for key in ENSEMBLE_PARAMETERS if key in (parameters or {})}
    request = AggregatorOps.Predict(names, records, deadline_ms, **chosen)
    try:
        info, tensors = await upstreams.get(model.address).call(request, tensors=inputs, timeout=timeout)
    except OpError as exc:  # the aggregator names members by address: name them as the HTTP client knows them
        raise type(exc)(with_member_names(model, str(exc))) from None
    return tensors[0], members_parameters(model, info)


def with_member_names(model, text):
    """`text` with each member address followed by its model name: `tcp://10.0.0.5:5700 (m1)`."""
    for address, name in model.members:
        text = text.replace(address, f"{address} ({name})")
    return text


def members_parameters(model, info):
    """answered: the members' names that answered (comma-separated); missing: `name: reason` of the others
    (semicolon-separated); their counts, and the aggregator's latency."""
    answered = [model.member_name(address) for address in info.get("answered", [])]
    missing = {model.member_name(address): reason for address, reason in (info.get("missing") or {}).items()}
    parameters = {"answered": ",".join(answered), "answered_count": len(answered),
                  "missing": "; ".join(f"{name}: {reason}" for name, reason in missing.items()),
                  "missing_count": len(missing)}
    if info.get("latency_ms") is not None:
        parameters["aggregator_latency_ms"] = info["latency_ms"]
    return parameters
