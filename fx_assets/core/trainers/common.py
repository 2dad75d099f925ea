"""Shared training machinery: the config model, the fold data type, evaluation and checkpoints.

- :class:`TrainConfig` (frozen pydantic) is the full training configuration; it is written into
  every checkpoint sidecar.
- :class:`FoldData` is one fold's model inputs and labels on the device, as
  :func:`fx_assets.core.trainers.transition.fold_transition` builds them (that module owns the
  fold transition, its labels and its CUDA kernels).
- Model selection (early stopping) is measured on a purged tail of the training rows by default
  (``early_stopping='inner'``, :func:`selection_split`), so the reported validation metrics are
  out of sample; with ``'validation'`` the validation quarter itself picks the epoch (biased
  upwards).
- :func:`evaluate_positions` turns a validation position path into the trading metrics.
- :func:`write_checkpoints` writes best/last safetensors and the JSON sidecar atomically.

Label convention (reference/microstructure.md §6): with entry lag ``d`` (default 1, next-bar
fills) ``y^(h)_j = ln(C_{j+d+h} / C_{j+d})``; a position decided at bar ``j`` earns
``pos_j · y^(1)_j − cost · |pos_j − pos_{j−1}|``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from fx_assets.core import labels
from fx_assets.core import metrics as M
from fx_assets.core.atomic import atomic_path, atomic_write_text
from fx_assets.core.configmodel import ConfigModel
from fx_assets.core.errors import FxDataError
from fx_assets.core.snapshot_labels import LabelForm, SnapshotLabelConfig, label_reach

if TYPE_CHECKING:  # torch is imported by the functions that run it (a config read needs no torch)
    import torch


class TrainParams(ConfigModel):
    """The trainer's settings (the training resource's ``train``); :class:`TrainConfig` adds the
    row unit, which comes from the pipeline (``fxcache.row_unit``), not from here."""

    trainer: Literal["mlp", "dqn"] = Field(description="Which trainer: supervised MLP or double DQN.")
    seed: int = Field(0, description="Seed of weights init, batch order, exploration.")
    epochs: int = Field(20, ge=1, description="Maximum epochs (early stopping may end sooner).")
    batch_size: int = Field(1024, ge=1, description="Minibatch size (MLP rows / DQN replay samples).")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate.")
    # Lists, not tuples: Dagster's config system has no tuple type.
    hidden: list[int] = Field(
        default_factory=lambda: [64, 64], description="Hidden layer widths of the MLP / Q trunk."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each hidden layer (MLP only).")
    weight_decay: float = Field(1e-5, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    patience: int = Field(5, ge=1, description="Epochs without validation improvement before stopping.")
    max_steps_per_epoch: int | None = Field(
        None, ge=1, description="Cap on optimiser steps per epoch (None: one pass over the training rows)."
    )
    horizons: list[int] = Field(
        default_factory=lambda: [1, 5, 30], description="Label horizons in bars (blended target)."
    )
    entry_lag: int = Field(1, ge=0, le=1, description="Bars between decision and fill (d in y^(h)): 0 or 1.")
    target: Literal["blended", "h1"] = Field(
        "blended", description="MLP training target: blended multi-horizon return or 1-bar return."
    )
    cost: float = Field(
        5e-5, ge=0, description="Cost per unit of position change, log-return units (1 tick / price ≈ 5e-5)."
    )
    input_columns: list[str] | None = Field(
        None, description="Model input columns (None: every non-price column of the fxcache)."
    )
    std_floor: float = Field(1e-12, gt=0, description="A column with train std below this is centred only.")
    clip_z: float = Field(10.0, gt=0, description="Normalised inputs are clipped to ±clip_z.")
    eval_threshold: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="MLP with trade_band='fixed': trades only when |p − 0.5| > threshold (else flat).",
    )
    trade_band: Literal["inner", "fixed"] = Field(
        "inner",
        description="MLP trading rule. 'inner': a no-trade band on |p − 0.5| (enter above, exit "
        "below a lower level) chosen after costs on the inner purged block of the training rows, "
        "flat unless the chosen band's inner net daily t-statistic reaches band_min_t; 'fixed': "
        "flat inside ±eval_threshold, costs ignored. With early_stopping='validation' the band is "
        "chosen on the same last inner_frac of the training rows, which the model was then fitted on.",
    )
    band_min_t: float = Field(
        3.0,
        ge=0,
        description="Net daily t-statistic (inner block) a band must reach to trade at all; it is the "
        "best of a few candidates, so the bar sits above the usual 2.",
    )
    val_metric: Literal["auto", "auc", "sharpe", "total_return"] = Field(
        "auto", description="Early-stopping metric (auto: AUC for MLP, Sharpe for DQN)."
    )
    early_stopping: Literal["inner", "validation"] = Field(
        "inner",
        description="Where the early-stopping metric is measured: 'inner' = the last inner_frac of the "
        "training rows, purged from the rows fitted on (no validation information reaches model "
        "selection); 'validation' = the validation quarter itself (selection-biased).",
    )
    inner_frac: float = Field(0.15, gt=0, lt=0.5, description="Share of training rows held out for 'inner'.")
    deterministic: bool = Field(True, description="torch.use_deterministic_algorithms during training.")
    block_rows: int | None = Field(
        None,
        ge=1,
        description="Rows per training block: an epoch visits the blocks of the fitted rows in a "
        "seeded order and shuffles within each block. None: a resident fold is one block (a "
        "streamed fold then uses the loader's stream_block_rows). Equal block_rows give the same "
        "training whether the fold is resident or streamed.",
    )
    # --- DQN
    gamma: float = Field(0.9, ge=0, lt=1, description="DQN discount per bar.")
    tau: float = Field(0.01, ge=0, le=1, description="Soft target update rate (0: periodic hard copy).")
    target_period: int = Field(500, ge=1, description="Hard target copy period in updates when tau == 0.")
    eps_start: float = Field(1.0, ge=0, le=1, description="Initial epsilon of epsilon-greedy.")
    eps_end: float = Field(0.05, ge=0, le=1, description="Final epsilon.")
    eps_decay_steps: int = Field(2000, ge=1, description="Updates over which epsilon decays linearly.")
    replay_size: int = Field(100_000, ge=1, description="Replay buffer capacity (transitions, on device).")
    n_envs: int = Field(256, ge=1, description="Parallel environments (start indices) stepped together.")
    episode_len: int = Field(256, ge=1, description="Bars per episode before an env restarts flat.")
    learn_starts: int = Field(1000, ge=0, description="Transitions collected before the first update.")
    huber_delta: float = Field(1.0, gt=0, description="Huber loss delta (on reward-scaled TD error).")
    reward_scale: float | None = Field(
        None, gt=0, description="Rewards are divided by this (None: std of training 1-bar returns)."
    )
    # --- snapshot row unit (one row per MBP-10 update; core.snapshot_labels)
    snapshot_horizons: list[int] = Field(
        default_factory=lambda: [10, 20, 50, 100, 500],
        description="Snapshot rows: label horizons in rows (book updates) ahead, all evaluated.",
    )
    train_horizon: int = Field(50, ge=1, description="Snapshot rows: the horizon (rows) trained on.")
    snapshot_form: LabelForm = Field(
        "unsmoothed", description="Snapshot rows: label form (unsmoothed, fi, deeplob, tlob)."
    )
    snapshot_smooth: int = Field(10, ge=1, description="Snapshot rows: TLOB smoothing window (rows).")
    snapshot_stationary_share: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Snapshot rows: dead band = this quantile of |change| on the training rows (None: 0).",
    )
    snapshot_zero: Literal["exclude", "three_class"] = Field(
        "exclude",
        description="Snapshot rows: stationary moves left out of loss and AUC (share reported), or a "
        "third class: the MLP then fits a 3-way softmax (up, stationary, down) by cross-entropy and "
        "scores (1 + P(up) - P(down)) / 2, its AUC taken over the up and down rows; the DQN refuses "
        "it (it learns from the 1-row mid change, not from label classes).",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainParams:
        if not self.horizons or any(h < 1 for h in self.horizons) or 1 not in self.horizons:
            raise ValueError(f"horizons must be positive and include 1, got {self.horizons}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden widths must be positive, got {self.hidden}")
        if self.trainer == "dqn" and self.snapshot_zero == "three_class":
            # the DQN's reward is the 1-row mid change and the label classes only score it, so a
            # third class would change nothing it learns: refused rather than silently ignored
            raise ValueError(
                "snapshot_zero='three_class' is for the MLP trainer: the DQN learns from the 1-row mid "
                "change (its reward), not from label classes; use snapshot_zero='exclude' with the DQN"
            )
        lab = self.snapshot_labels()  # validates the snapshot horizons
        if self.train_horizon not in lab.horizons:
            raise ValueError(
                f"train_horizon {self.train_horizon} is not one of snapshot_horizons {lab.horizons}"
            )
        return self

    def snapshot_labels(self) -> SnapshotLabelConfig:
        """The label config of snapshot rows (every horizon; the trainer fits ``train_horizon``)."""
        return SnapshotLabelConfig(
            horizons=list(self.snapshot_horizons),
            form=self.snapshot_form,
            smooth=self.snapshot_smooth,
            stationary_share=self.snapshot_stationary_share,
            zero=self.snapshot_zero,
        )


class TrainConfig(TrainParams):
    """Everything that decides a trained model (part of its cache key and checkpoint sidecar)."""

    row_unit: Literal["bar", "snapshot"] = Field(
        "bar",
        description="What a row of the fold is: a bar or one book update. Set from the pipeline's "
        "fxcache.row_unit; the fold transition refuses data whose file says otherwise.",
    )

    @property
    def purge_bars(self) -> int:
        """Minimum gap (rows) between train_end and val_start: the longest label reach, of the
        bar labels (entry lag + longest horizon) or, for snapshot rows, of every snapshot
        horizon (``snapshot_labels.label_reach``: h + the rows the label reads up to n)."""
        if self.row_unit == "snapshot":
            return label_reach(self.snapshot_labels())
        return labels.max_horizon(self.horizons, self.entry_lag)

    @property
    def three_class(self) -> bool:
        """Whether the MLP fits three classes (up, stationary, down): snapshot rows with
        ``snapshot_zero='three_class'``."""
        return self.row_unit == "snapshot" and self.snapshot_zero == "three_class"

    def metric_name(self) -> str:
        if self.val_metric != "auto":
            return self.val_metric
        return "auc" if self.trainer == "mlp" else "sharpe"


class FoldRangeLike(Protocol):
    """Half-open row ranges of a fold in a DeviceSlice (fx_assets.core.folds.FoldRange)."""

    @property
    def train_start(self) -> int: ...
    @property
    def train_end(self) -> int: ...
    @property
    def val_start(self) -> int: ...
    @property
    def val_end(self) -> int: ...


@dataclass(frozen=True)
class FoldData:
    """One fold's model inputs and labels, on the device.

    Training rows are ``[train_start, train_end)`` of the slice, validation rows
    ``[val_start, val_end)``; both in bar order (the DQN environment steps through them).
    ``y_*`` is the training target (blended or 1-bar), ``r1_*`` the 1-bar forward return
    (float64; NaN where its prices lie past ``val_end``).
    """

    keys: tuple[str, ...]
    bounds: tuple[int, int, int, int]  # train_start, train_end, val_start, val_end
    columns: tuple[str, ...]
    mean: torch.Tensor  # [f] float64, training rows only
    std: torch.Tensor  # [f] float64 (floored to 1 where below std_floor)
    x_train: torch.Tensor  # [n_tr, f] float32
    y_train: torch.Tensor  # [n_tr] float64
    r1_train: torch.Tensor  # [n_tr] float64
    x_val: torch.Tensor  # [n_val, f] float32
    y_val: torch.Tensor  # [n_val] float64
    r1_val: torch.Tensor  # [n_val] float64
    val_ts: npt.NDArray[np.int64]
    val_sessions: npt.NDArray[np.int32]
    train_sessions: npt.NDArray[np.int32]
    horizons: tuple[int, ...]
    entry_lag: int
    target: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    def norm_stats(self) -> dict[str, Any]:
        """JSON-ready per-fold normalisation statistics (float64 values round-trip exactly)."""
        return {
            "columns": list(self.columns),
            "mean": [float(v) for v in self.mean.cpu().tolist()],
            "std": [float(v) for v in self.std.cpu().tolist()],
            "n_train_rows": int(self.x_train.shape[0]),
            "train_rows": [self.bounds[0], self.bounds[1]],
        }


def selection_split(fold: Any, cfg: TrainConfig) -> tuple[int, int]:
    """(fit_end, inner_start) in training-row indices.

    With ``early_stopping='inner'`` the model is fitted on ``[0, fit_end)`` and selected on
    ``[inner_start, n_train)``; ``inner_start - fit_end`` is the label reach, so no fitted label
    reads an inner-block price. With ``'validation'`` it fits on every training row.
    """
    n_tr = int(fold.n_train)  # a FoldData or FoldRows
    if cfg.early_stopping == "validation":
        return n_tr, n_tr
    inner_start = n_tr - max(1, int(n_tr * cfg.inner_frac))
    fit_end = inner_start - cfg.purge_bars
    if fit_end < 2:
        raise FxDataError(
            f"fold {fold.keys}: {n_tr} training rows leave nothing to fit after the inner block"
        )
    return fit_end, inner_start


# ---------------------------------------------------------------------------- determinism
@contextlib.contextmanager
def seeded(seed: int, deterministic: bool = True) -> Iterator[None]:
    """Seed torch and (optionally) switch on deterministic algorithms, restoring the flags after."""
    import torch

    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_bench = torch.backends.cudnn.benchmark
    # cuBLAS needs this before its first call to be deterministic; harmless on the CPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
        torch.backends.cudnn.benchmark = prev_bench


def make_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, capturable: bool = False
) -> torch.optim.Optimizer:
    """AdamW; the fused kernel on CUDA (one launch per step instead of one per tensor group).

    ``capturable`` keeps the step count on the device, so the step can live in a CUDA graph.
    """
    import torch

    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
        capturable=capturable and fused,
    )


def use_cuda_graph(dev: torch.device) -> bool:
    """Whether a trainer captures its training iteration as a CUDA graph (``FX_CUDA_GRAPHS=0``: never)."""
    return dev.type == "cuda" and os.environ.get("FX_CUDA_GRAPHS", "1") != "0"


class GraphRunner:
    """Runs the training iteration ``n`` times: eagerly, or as replays of one captured CUDA graph.

    The first ``_WARMUP`` iterations run eagerly on a side stream (cuBLAS workspaces, optimizer
    state and autograd buffers come into being there, as capture requires); they are real
    iterations and count towards the epoch.
    """

    _WARMUP = 3

    def __init__(self, fn: Any, dev: torch.device, graphed: bool, gen: torch.Generator | None = None) -> None:
        self.fn, self.dev, self.graphed, self.gen = fn, dev, graphed, gen
        self.graph: Any = None
        self.done = 0
        self.error = ""

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def run(self, n: int) -> None:
        import torch

        if not self.graphed:
            for _ in range(n):
                self.fn()
            return
        i = 0
        if self.graph is None:
            side = torch.cuda.Stream(device=self.dev)
            side.wait_stream(torch.cuda.current_stream(self.dev))
            with torch.cuda.stream(side):
                while i < n and self.done < self._WARMUP:
                    self.fn()
                    i += 1
                    self.done += 1
            torch.cuda.current_stream(self.dev).wait_stream(side)
            if i == n:
                return
            g = torch.cuda.CUDAGraph()
            try:
                if self.gen is not None and hasattr(g, "register_generator_state"):
                    g.register_generator_state(self.gen)
                with torch.cuda.graph(g):
                    self.fn()
            except RuntimeError as exc:  # nothing ran during the failed capture: go on eagerly
                torch.cuda.synchronize(self.dev)
                warnings.warn(f"CUDA graph capture failed ({exc}); running eagerly", stacklevel=2)
                self.graphed, self.error = False, str(exc)
                for _ in range(n - i):
                    self.fn()
                return
            self.graph = g
        for _ in range(n - i):
            self.graph.replay()


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# ---------------------------------------------------------------------------- evaluation
def evaluate_positions(
    pos: npt.NDArray[np.int8],
    r1: npt.NDArray[np.float64],
    sessions: npt.NDArray[np.int32],
    cost: float,
) -> tuple[dict[str, float], npt.NDArray[np.int8], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Trading metrics of validation positions: (metrics, positions, net returns, equity curve).

    Positions are forced flat where the 1-bar return is undefined (the last ``entry_lag + 1``
    validation bars, whose prices lie past the quarter), so a final position is closed and its
    cost paid. Net returns follow ``metrics.strategy_returns``; the equity curve is
    ``metrics.equity_curve`` (``E_0 = 1`` then one point per validation bar, length n + 1).
    ``sharpe``, ``total_return``, ``t_stat`` are net of cost; ``gross_*`` are the same figures
    before cost, ``net_*`` repeat the net ones under an explicit name, ``cost_paid`` is the sum of
    ``cost · |Δpos|`` (log-return units).
    """
    ok = np.isfinite(r1)
    p = np.where(ok, pos, 0).astype(np.int8)
    y = np.where(ok, r1, 0.0)
    ret = M.strategy_returns(p, y, cost)
    gross = M.strategy_returns(p, y, 0.0)
    hr = M.hit_rate(p, np.where(ok, r1, np.nan))

    def t_stat(x: npt.NDArray[np.float64]) -> float:
        sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
        return float(x.mean() / (sd / math.sqrt(x.size))) if sd > 0 else 0.0

    sharpe = float(M.sharpe_daily(ret, sessions))
    gross_sharpe = float(M.sharpe_daily(gross, sessions))
    out = {
        "sharpe": sharpe,
        "max_drawdown": float(M.max_drawdown(ret)),
        "hit_rate": hr.rate,
        "coverage": hr.coverage,
        "turnover": float(M.turnover(p)),
        "total_log_return": float(ret.sum()),  # log returns add over bars
        "total_return": float(np.expm1(ret.sum())),  # compounded
        "mean_bar_return": float(ret.mean()),
        # t statistic of the mean bar return: the "consistent profit" check of the null market.
        "t_stat": t_stat(ret),
        "gross_sharpe": gross_sharpe,
        "net_sharpe": sharpe,
        "gross_total_log_return": float(gross.sum()),
        "net_total_log_return": float(ret.sum()),
        "gross_t_stat": t_stat(gross),
        "cost_paid": float(gross.sum() - ret.sum()),
        "n_val_bars": float(ret.size),
        "n_sessions": float(np.unique(sessions).size),
    }
    return out, p, ret, M.equity_curve(ret)


def leak_detector(
    scores: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    r1: npt.NDArray[np.float64],
    cfg: TrainConfig,
    n_perm: int = 200,
) -> dict[str, float]:
    """Validation AUCs against their empirical null: labels permuted in blocks of twice the label
    reach (longer than the longest horizon), so overlapping labels widen the null as they should.

    ``auc_null_{sd,z,p}`` for the training target's sign, ``auc_h1_null_{sd,z,p}`` for the 1-bar
    return's sign. Without edge ``z`` is O(1) and ``p`` uniform; a leak (or real skill) drives
    ``|z|`` up and ``p`` to ``1 / (n_perm + 1)``.
    """
    out: dict[str, float] = {"auc_null_block": float(2 * cfg.purge_bars), "auc_null_n_perm": float(n_perm)}
    for name, lab in (("auc", y), ("auc_h1", r1)):
        res = M.auc_block_null(scores, lab, block=2 * cfg.purge_bars, n_perm=n_perm, seed=cfg.seed)
        out.update({f"{name}_null_sd": res.null_sd, f"{name}_null_z": res.z, f"{name}_null_p": res.p_value})
    return out


# ---------------------------------------------------------------------------- results, checkpoints
@dataclass
class TrainResult:
    """What a trainer hands back: validation metrics of the best epoch and where it wrote them."""

    metrics: dict[str, float]
    equity: npt.NDArray[np.float64]
    val_positions: npt.NDArray[np.int8]
    val_returns: npt.NDArray[np.float64]
    best_path: Path
    last_path: Path
    sidecar_path: Path
    best_epoch: int
    history: list[dict[str, float]]
    val_scores: npt.NDArray[np.float64] | None = None  # the best epoch's score per validation row
    # a three-class MLP's best-epoch probabilities [n_val, 3]: up, stationary, down
    val_proba: npt.NDArray[np.float64] | None = None


def state_to_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached, contiguous CPU copy of a model's state (safe to keep as 'best')."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}


def write_checkpoints(
    out_dir: Path | str,
    best_state: dict[str, torch.Tensor],
    last_state: dict[str, torch.Tensor],
    sidecar: dict[str, Any],
) -> tuple[Path, Path, Path]:
    """Atomically write ``best.safetensors``, ``last.safetensors`` and ``checkpoint.json``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    best, last, side = out / "best.safetensors", out / "last.safetensors", out / "checkpoint.json"
    for path, state in ((best, best_state), (last, last_state)):
        with atomic_path(path) as tmp:
            save_file(state, str(tmp), metadata={"format": "fx_assets.trainer.v1"})
    atomic_write_text(side, json.dumps(sidecar, indent=2, sort_keys=True, allow_nan=True))
    return best, last, side


def finish_training(
    out_dir: Path | str,
    best_state: dict[str, torch.Tensor],
    last_state: dict[str, torch.Tensor],
    sidecar: dict[str, Any],
    best_out: tuple[Any, ...],
    best_epoch: int,
    history: list[dict[str, float]],
) -> TrainResult:
    """Write the checkpoints and hand back the best epoch's validation results."""
    m, pos, ret, eq = best_out[:4]
    best_p, last_p, side_p = write_checkpoints(out_dir, best_state, last_state, sidecar)
    return TrainResult(
        metrics=dict(m),
        equity=eq,
        val_positions=pos,
        val_returns=ret,
        best_path=best_p,
        last_path=last_p,
        sidecar_path=side_p,
        best_epoch=best_epoch,
        history=history,
        val_scores=np.asarray(best_out[4], dtype=np.float64) if len(best_out) > 4 else None,
        val_proba=np.asarray(best_out[5], dtype=np.float64) if len(best_out) > 5 else None,
    )


def load_state(path: Path | str, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Read a safetensors checkpoint (for ``model.load_state_dict``)."""
    from safetensors.torch import load_file

    return load_file(str(path), device=str(device))


def sidecar_base(
    fold: Any, cfg: TrainConfig, input_keys: Sequence[str], arch: dict[str, Any]
) -> dict[str, Any]:
    return {
        "format": "fx_assets.trainer.v1",
        "config": cfg.model_dump(mode="json"),
        "input_keys": list(input_keys),
        "fold": {
            "keys": list(fold.keys),
            "train": [fold.bounds[0], fold.bounds[1]],
            "val": [fold.bounds[2], fold.bounds[3]],
        },
        "norm": fold.norm_stats(),
        "architecture": arch,
    }


def mlp_layers(in_dim: int, hidden: Sequence[int], out_dim: int, dropout: float = 0.0) -> torch.nn.Sequential:
    """Plain ReLU MLP."""
    import torch

    layers: list[torch.nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [torch.nn.Linear(d, h), torch.nn.ReLU()]
        if dropout > 0:
            layers.append(torch.nn.Dropout(dropout))
        d = h
    layers.append(torch.nn.Linear(d, out_dim))
    return torch.nn.Sequential(*layers)


class EarlyStopping:
    """Keeps the best epoch by the selection metric (weights, evaluation) and says when to stop.

    ``best`` holds what the trainer evaluated at the best epoch; if the metric was NaN every
    epoch (e.g. a single-class block), the last epoch counts as best.
    """

    def __init__(self, metric: str, patience: int, model: torch.nn.Module) -> None:
        self.metric, self.patience = metric, patience
        self.value, self.epoch, self.bad = math.nan, -1, 0
        self.state = state_to_cpu(model)
        self.best: tuple[Any, ...] | None = None

    def update(self, epoch: int, value: float, model: torch.nn.Module, evaluation: tuple[Any, ...]) -> bool:
        """Record one epoch; True when training should stop."""
        self.last = (epoch, model, evaluation)
        if is_better(self.metric, value, self.value):
            self.value, self.epoch, self.bad = value, epoch, 0
            self.state = state_to_cpu(model)
            self.best = evaluation
            return False
        self.bad += 1
        return self.bad >= self.patience

    def finish(self) -> tuple[int, dict[str, torch.Tensor], tuple[Any, ...]]:
        """(best epoch, its weights on the host, its evaluation)."""
        if self.best is None:
            epoch, model, evaluation = self.last
            return epoch, state_to_cpu(model), evaluation
        return self.epoch, self.state, self.best


def is_better(metric: str, value: float, best: float) -> bool:
    """Higher is better for every early-stopping metric; NaN never improves."""
    del metric
    return not math.isnan(value) and (math.isnan(best) or value > best)
