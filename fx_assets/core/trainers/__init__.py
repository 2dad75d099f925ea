"""Trainers of the walk-forward stage (torch): the fold transition, a supervised MLP baseline and a
double-DQN trading agent. Every trainer reads a :class:`~fx_assets.core.trainers.common.FoldData`
built on the device from resident fxcache data and writes safetensors checkpoints with a JSON
sidecar.

The torch-free names (configs, result types) import eagerly; the trainers themselves load on
first access (PEP 562), so a process that only reads a ``TrainConfig`` (a feature run loading the
code location) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fx_assets.core.trainers.common import FoldData, TrainConfig, TrainResult

if TYPE_CHECKING:
    from fx_assets.core.trainers.dqn import train_dqn
    from fx_assets.core.trainers.mlp import train_mlp
    from fx_assets.core.trainers.transition import fold_transition

#: Lazily imported names -> the submodule defining them.
_LAZY = {"train_dqn": "dqn", "train_mlp": "mlp", "fold_transition": "transition"}

__all__ = ["FoldData", "TrainConfig", "TrainResult", "fold_transition", "train_dqn", "train_mlp"]


def __getattr__(name: str) -> Any:
    sub = _LAZY.get(name)
    if sub is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{sub}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
