"""The base class of every stage config: frozen, no unknown fields, every float finite.

Each stage's parameters (bars, bar features, OFI, fxcache, folds, trainer) are one pydantic
model derived from :class:`ConfigModel`, so the rules hold for all of them, including fields
added later: an unknown key is an error (a typo never silently falls back to a default), and
NaN / ±inf in any float field (plain, optional or in a list) fails validation with an error
naming the field ("Input should be a finite number"); a non-finite size, rate or cost would
otherwise run to the end and save a model with a NaN Sharpe. The Dagster ``Config`` subclasses
inherit these settings (pydantic merges ``model_config`` along the bases).

Deriving a config with ``model_copy(update=...)`` goes through the same validation
(:class:`ValidatedCopy`): pydantic's own copy skips it, so a NaN reached a stage, and a Dagster
resource copied that way kept its old config dictionary, from which Dagster rebuilds the
resource an asset gets (the update was silently dropped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class ValidatedCopy(BaseModel):
    """``model_copy(update=...)`` builds a new instance through the constructor: the update is
    validated, and a Dagster resource gets the config dictionary it is rebuilt from."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        if not update:
            return super().model_copy(deep=deep)
        values = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self)(**{**values, **update})


class ConfigModel(ValidatedCopy):
    """Frozen, ``extra="forbid"``, ``allow_inf_nan=False``: the shared rules of stage configs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
