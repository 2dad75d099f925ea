"""The base class of every stage config: frozen, no unknown fields, every float finite.

Each stage's parameters (bars, bar features, OFI, fxcache, folds, trainer) are one pydantic
model derived from :class:`ConfigModel`, so the rules hold for all of them, including fields
added later: an unknown key is an error (a typo never silently falls back to a default), and
NaN / ±inf in any float field (plain, optional or in a list) fails validation with an error
naming the field ("Input should be a finite number"); a non-finite size, rate or cost would
otherwise run to the end and save a model with a NaN Sharpe. The Dagster ``Config`` subclasses
inherit these settings (pydantic merges ``model_config`` along the bases).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """Frozen, ``extra="forbid"``, ``allow_inf_nan=False``: the shared rules of stage configs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
