"""The model store as the api reads it: every model, what a name resolves to (exact, `:latest` or an alias) and the
aliases; the catalog projection's typed readers over the live state."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.projections import catalog
from blazar.projections.catalog import StoredModel, TemplateProbe

__all__ = ["StoredModel", "TemplateProbe", "alias_target", "aliases", "is_model", "model", "models"]


def model(app: Blazar, name: str) -> StoredModel | None:
    """The model `name` resolves to, or None."""
    return catalog.stored(app.runner.state("catalog"), name)


def models(app: Blazar) -> list[StoredModel]:
    """Every model in the store, by name."""
    return catalog.models(app.runner.state("catalog"))


def aliases(app: Blazar) -> dict[str, str]:
    """Every alias with the model it names."""
    return catalog.aliases(app.runner.state("catalog"))


def alias_target(app: Blazar, alias: str) -> str | None:
    """The model `alias` names, or None when it is no alias."""
    return catalog.alias_target(app.runner.state("catalog"), alias)


def is_model(app: Blazar, name: str) -> bool:
    """`name` is a model's own name (not an alias, not `name:latest`)."""
    return catalog.is_model(app.runner.state("catalog"), name)
