"""Trainers of the walk-forward stage (torch): the fold transition, a supervised MLP baseline and a
double-DQN trading agent. Every trainer reads a :class:`~fx_assets.core.trainers.common.FoldData`
built on the device from resident fxcache data and writes safetensors checkpoints with a JSON
sidecar.
"""

from __future__ import annotations

from fx_assets.core.trainers.common import FoldData, TrainConfig, TrainResult
from fx_assets.core.trainers.dqn import train_dqn
from fx_assets.core.trainers.mlp import train_mlp
from fx_assets.core.trainers.transition import fold_transition

__all__ = ["FoldData", "TrainConfig", "TrainResult", "fold_transition", "train_dqn", "train_mlp"]
