"""Where each model is, across the nodes sharing a log: every node (from the nodes projection) with the models in
its own store (its node-local catalog events folded alone, as that node's runner folds them) and the models it has
loaded now (the cluster's residency). For `blazar node list` and the console."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from blazar.context import Blazar
from blazar.events.base import NodeLocal
from blazar.projections.catalog import CatalogProjection
from blazar.projections.catalog import models as catalog_models
from blazar.projections.nodes import nodes
from blazar.projections.residency import instances


async def where(app: Blazar) -> dict[str, Any]:
    """{"this_node", "nodes": [each node's row with "models" (its store) and "loaded" (ready instances' models)]}."""
    listed = nodes(app.runner.state("nodes"))
    projection = CatalogProjection()
    assert projection.types is not None
    states = {n.name: projection.initial() for n in listed}
    async for rec in app.log.read(types=sorted(projection.types)):
        ev = rec.event
        owner = ev.node if isinstance(ev, NodeLocal) else ""
        for name, state in states.items():
            if owner in ("", name):  # aliases and settings are the cluster's; files are their node's
                states[name] = projection.apply(state, rec)
    loaded: dict[str, list[str]] = {}
    for i in instances(app.runner.state("residency")):
        if i.state == "ready":
            loaded.setdefault(i.node, []).append(i.model)
    rows = [asdict(n) | {"models": sorted(m.name for m in catalog_models(states[n.name])),
                         "loaded": sorted(set(loaded.get(n.name, [])))} for n in listed]
    return {"this_node": app.node or None, "nodes": rows}
