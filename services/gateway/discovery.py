"""Keeping the gateway's catalog current: which models the upstream serves, and whether each is ready.

Why a background refresh: members join, leave and die while the gateway runs, and asking for them
on every request would double each request's round trips. Every `refresh_s` the aggregator is
asked for its members and each member for its `model_info` (a model server alone: that one); a
member that stops answering keeps its last metadata, marked not ready, so its name stays known.
"""

import asyncio
import logging
from dataclasses import replace

from zmqflow.common.errors import OpError
from zmqflow.common.wire.protocol import AggregatorOps, ServeOps
from zmqflow.services.gateway.catalog import ENSEMBLE, MEMBER, SERVER, Catalog, model_from_info, unique_names

log = logging.getLogger(__name__)

INFO_TIMEOUT_S = 1.0
"""How long a model_info or members question may take (no grace: a silent member is simply not ready)."""
ENSEMBLE_VERSION = "1"


class Discovery:
    def __init__(self, upstreams, aggregator=None, server=None, ensemble_name="ensemble", refresh_s=5.0):
        if (aggregator is None) == (server is None):
            raise ValueError("a gateway fronts one aggregator or one model server")
        self.upstreams, self.aggregator, self.server = upstreams, aggregator, server
        self.ensemble_name, self.refresh_s = ensemble_name, refresh_s
        self.catalog = Catalog()
        self.error = "not asked yet"   # why the last refresh failed (None: it worked)
        self._known = {}               # member address -> its last model_info

    async def refresh(self):
        """Rebuild the catalog from the upstream's answers now; keep the old one (and say why) if it fails."""
        try:
            self.catalog = await (self._ensemble() if self.aggregator else self._single())
            self.error = None
        except (OpError, KeyError, TypeError, ValueError) as exc:  # no answer, or one without a usable schema
            self.error = str(exc) if isinstance(exc, OpError) else f"unusable answer: {exc!r}"
            log.warning("cannot refresh the models of %s: %s", self.aggregator or self.server, exc)
            self.catalog = Catalog({name: _not_ready(model) for name, model in self.catalog.models.items()},
                                   self.catalog.loaded)

    def ready(self):
        """(whether the gateway is ready: the upstream answers and one model is ready, why not or None)."""
        ready = self.error is None and any(m.ready for m in self.catalog.models.values())
        return ready, None if ready else (self.error or "no model is ready")

    async def run(self):
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def _single(self):
        info, _ = await self.upstreams.get(self.server).call(ServeOps.ModelInfo(), timeout=INFO_TIMEOUT_S, grace=0)
        model = model_from_info(info, SERVER, self.server)
        return Catalog({model.name: model}, loaded=True)

    async def _ensemble(self):
        result, _ = await self.upstreams.get(self.aggregator).call(AggregatorOps.Members(), timeout=INFO_TIMEOUT_S,
                                                                   grace=0)
        members = result.get("members") or []
        answers = await asyncio.gather(*(self._member_info(m["address"]) for m in members))
        models, pairs = {}, []
        known = [(m, info) for m, info in zip(members, answers) if info is not None]
        for (member, (info, answered)), name in zip(known, unique_names([str(i[0].get("model")) for _, i in known])):
            address = member["address"]
            models[name] = model_from_info(info, MEMBER, address, name, ready=answered and member.get("healthy", True))
            pairs.append((address, name))
        if known:  # the ensemble takes what its members take (the first one's schema); it is ready while one is
            ensemble = model_from_info(known[0][1][0], ENSEMBLE, self.aggregator, self.ensemble_name,
                                       any(m.ready for m in models.values()), pairs)
            models[self.ensemble_name] = replace(ensemble, version=ENSEMBLE_VERSION)
        return Catalog(models, loaded=True)

    async def _member_info(self, address):
        """(model_info, answered now) of a member: its last known one when it does not answer; None if never."""
        try:
            info, _ = await self.upstreams.get(address).call(ServeOps.ModelInfo(), timeout=INFO_TIMEOUT_S, grace=0)
            self._known[address] = info
            return info, True
        except OpError as exc:
            log.info("member %s did not answer model_info: %s", address, exc)
            info = self._known.get(address)
            return None if info is None else (info, False)


def _not_ready(model):
    return replace(model, ready=False)
