"""Shared training machinery: the config model, the fold transition, evaluation and checkpoints.

Owns the one place where a fold's model inputs and labels come into being (DESIGN §4, §6):

- :func:`fold_transition` takes a resident :class:`~fx_assets.core.device_store.DeviceSlice` and a
  fold's half-open index ranges and, with device ops and no host sync before its checks, (1) slices the input columns
  of ``[train_start, val_end)`` (price columns are never inputs: raw price levels leaked the future
  regime into states once), (2) computes z-score statistics from the *training rows only*,
  (3) derives the 1-bar forward return and the blended multi-horizon target from the float64
  close column restricted to ``[train_start, val_end)`` — so no label can read a price beyond the
  validation quarter — and (4) checks, with one host sync at the end, that the purge holds, that
  every training label is defined (unless ``segments`` marks contract rolls, whose spanning
  labels are NaN and left out), that every close is finite and positive, and that no input is
  NaN/Inf. The labels follow ``core.labels`` op for op (its torch functions are not called: they
  sync once each to validate the close column). On CUDA, three Triton kernels (see "fused CUDA
  kernels" below) do the statistics, the normalisation and the labels; elsewhere torch ops do.
- Model selection (early stopping) is measured on a purged tail of the training rows by default
  (``early_stopping='inner'``), so the reported validation metrics are out of sample; with
  ``'validation'`` the validation quarter itself picks the epoch (biased upwards).
- :class:`TrainConfig` (frozen pydantic) is the full training configuration; it is written into
  every checkpoint sidecar.
- :func:`evaluate_positions` turns a validation position path into the trading metrics.
- :func:`write_checkpoints` writes best/last safetensors and the JSON sidecar atomically.

Label convention (reference/microstructure.md §6): with entry lag ``d`` (default 1, next-bar
fills) ``y^(h)_j = ln(C_{j+d+h} / C_{j+d})``; a position decided at bar ``j`` earns
``pos_j · y^(1)_j − cost · |pos_j − pos_{j−1}|``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file, save_file

from fx_assets.core import calendar, labels
from fx_assets.core import metrics as M
from fx_assets.core.atomic import atomic_path, atomic_write_text
from fx_assets.core.device_store import CLOSE_COLUMN, DEFAULT_PRICE_COLUMNS, DeviceSlice
from fx_assets.core.errors import FxDataError


class TrainConfig(BaseModel):
    """Everything that decides a trained model (part of its cache key and checkpoint sidecar)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
        None, description="Rewards are divided by this (None: std of training 1-bar returns)."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not self.horizons or any(h < 1 for h in self.horizons) or 1 not in self.horizons:
            raise ValueError(f"horizons must be positive and include 1, got {self.horizons}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden widths must be positive, got {self.hidden}")
        return self

    @property
    def purge_bars(self) -> int:
        """Minimum gap between train_end and val_start: the longest label reach."""
        return labels.max_horizon(self.horizons, self.entry_lag)

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

    def norm_stats(self) -> dict[str, Any]:
        """JSON-ready per-fold normalisation statistics (float64 values round-trip exactly)."""
        return {
            "columns": list(self.columns),
            "mean": [float(v) for v in self.mean.cpu().tolist()],
            "std": [float(v) for v in self.std.cpu().tolist()],
            "n_train_rows": int(self.x_train.shape[0]),
            "train_rows": [self.bounds[0], self.bounds[1]],
        }


# ---------------------------------------------------------------------------- labels
def _labels(close: torch.Tensor, horizons: Sequence[int], lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(1-bar forward return, blended target), the formulas of ``core.labels`` without its syncs.

    ``labels.*_torch`` check the close column with a host sync each; here that check is one of
    the deferred checks of :func:`fold_transition`. The arithmetic is the same op for op (the
    blended target accumulates ``y^(h) / sqrt(h)`` in ``horizons`` order from zero, then divides
    by the count), so the results are bitwise those of ``core.labels``.
    """
    hs = tuple(int(h) for h in horizons)
    labels.max_horizon(hs, lag)  # validates horizons and lag (no device work)
    logc = torch.log(close)
    n = logc.shape[0]
    r1 = torch.full_like(logc, float("nan"))
    m1 = n - lag - 1
    if m1 > 0:
        r1[:m1] = logc[lag + 1 :] - logc[lag : lag + m1]
    blended = torch.full_like(logc, float("nan"))
    m = n - lag - max(hs)  # rows where every horizon is defined
    if m > 0:
        acc = torch.zeros(m, dtype=logc.dtype, device=logc.device)
        for h in hs:
            acc = acc + (logc[lag + h : lag + h + m] - logc[lag : lag + m]) / math.sqrt(h)
        blended[:m] = acc / len(hs)
    return r1, blended


# ---------------------------------------------------------------------------- fused CUDA kernels
# Two Triton kernels do the heavy part of a fold transition on CUDA in two passes over the
# slice (torch needs six: gather, widen to f64, var_mean, addcmul, clamp, validation sum):
#   1. column sums of (x - k) and (x - k)^2 in float64 over the training rows (k = the first
#      training row, so the one-pass variance has no cancellation), per-program partials that
#      torch adds up in a fixed order (deterministic);
#   2. gather of the input columns, (x - mean) / std, clip, and a count of non-finite inputs.
# Without Triton, on the CPU, or if a kernel fails to build, the torch path runs instead.
_KERNELS: dict[str, Any] = {}
_FUSED_STATE = {"enabled": os.environ.get("FX_FUSED_FOLD", "1") != "0", "error": ""}


def _kernels() -> dict[str, Any] | None:
    if not _FUSED_STATE["enabled"]:
        return None
    if _KERNELS:
        return _KERNELS
    try:
        triton = importlib.import_module("triton")
        tl = importlib.import_module("triton.language")
    except ImportError as exc:
        _FUSED_STATE.update(enabled=False, error=f"no triton: {exc}")
        return None

    @triton.jit
    def col_stats(
        v_ptr,
        k_ptr,
        part_ptr,
        row0,
        n_rows,
        stride,
        width,
        rows_per_prog,
        BLOCK_R: tl.constexpr,  # type: ignore[name-defined]
        BLOCK_C: tl.constexpr,  # type: ignore[name-defined]
    ):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < width
        k = tl.load(k_ptr + cols, mask=cmask, other=0.0)
        # elementwise accumulators, reduced across rows once at the end
        s1 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
        s2 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
        start = pid * rows_per_prog
        end = tl.minimum(start + rows_per_prog, n_rows)
        for r0 in range(start, end, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            m = (rows < end)[:, None] & cmask[None, :]
            ptrs = v_ptr + (row0 + rows).to(tl.int64)[:, None] * stride + cols[None, :]
            x = tl.load(ptrs, mask=m, other=0.0).to(tl.float64)
            d = tl.where(m, x - k[None, :], 0.0)
            s1 += d
            s2 += d * d
        base = part_ptr + pid * 2 * BLOCK_C
        tl.store(base + cols, tl.sum(s1, axis=0))
        tl.store(base + BLOCK_C + cols, tl.sum(s2, axis=0))

    @triton.jit
    def normalise(
        v_ptr,
        idx_ptr,
        scale_ptr,
        shift_ptr,
        out_ptr,
        bad_ptr,
        row0,
        n_out,
        stride,
        n_feat,
        clip,
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        # one program per BLOCK consecutive outputs of the row-major [m, n_feat] result
        pid = tl.program_id(0)
        e = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = e < n_out
        row = e // n_feat
        j = (e - row * n_feat).to(tl.int32)
        src = tl.load(idx_ptr + j, mask=ok, other=0)
        sc = tl.load(scale_ptr + j, mask=ok, other=0.0)
        sh = tl.load(shift_ptr + j, mask=ok, other=0.0)
        x = tl.load(v_ptr + (row0 + row) * stride + src, mask=ok, other=0.0).to(tl.float32)
        y = x * sc + sh
        y = tl.minimum(tl.maximum(y, -clip), clip)
        tl.store(out_ptr + e, y, mask=ok)
        bad = ok & ((x != x) | (tl.abs(x) > 3.4028234663852886e38))
        tl.store(bad_ptr + pid, tl.sum(bad.to(tl.int32), axis=0))

    @triton.jit
    def fwd_labels(
        close_ptr,
        r1_ptr,
        bl_ptr,
        cnt_ptr,
        hs_ptr,
        den_ptr,
        cs,
        n,
        n_tr,
        lag,
        h_max,
        N_H: tl.constexpr,  # type: ignore[name-defined]
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        # r1_j = ln C[j+d+1] - ln C[j+d]; blended_j = (sum_h (ln C[j+d+h] - ln C[j+d]) / sqrt h) / |H|
        # (the op order of core.labels); NaN where a horizon runs past the slice
        pid = tl.program_id(0)
        j = pid * BLOCK + tl.arange(0, BLOCK)
        inb = j < n
        c = tl.load(close_ptr + j * cs, mask=inb, other=1.0)
        bad_c = inb & ~((c == c) & (c > 0) & (c < float("inf")))
        ok_b = inb & ((j + lag) < n)
        lb = tl.log(tl.load(close_ptr + (j + lag) * cs, mask=ok_b, other=1.0))
        ok1 = inb & ((j + lag + 1) < n)
        r1 = tl.log(tl.load(close_ptr + (j + lag + 1) * cs, mask=ok1, other=1.0)) - lb
        r1 = tl.where(ok1, r1, float("nan"))
        okh = inb & ((j + lag + h_max) < n)
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        for i in tl.static_range(N_H):
            h = tl.load(hs_ptr + i)
            den = tl.load(den_ptr + i)
            lh = tl.log(tl.load(close_ptr + (j + lag + h) * cs, mask=okh, other=1.0))
            acc = acc + (lh - lb) / den
        bl = tl.where(okh, acc / N_H, float("nan"))
        tl.store(r1_ptr + j, r1, mask=inb)
        tl.store(bl_ptr + j, bl, mask=inb)
        tr = inb & (j < n_tr)
        bl_bad = tr & ~((bl == bl) & (tl.abs(bl) < float("inf")))
        r1_bad = tr & ~((r1 == r1) & (tl.abs(r1) < float("inf")))
        tl.store(cnt_ptr + pid * 3, tl.sum(bl_bad.to(tl.int32), axis=0))
        tl.store(cnt_ptr + pid * 3 + 1, tl.sum(r1_bad.to(tl.int32), axis=0))
        tl.store(cnt_ptr + pid * 3 + 2, tl.sum(bad_c.to(tl.int32), axis=0))

    _KERNELS.update(
        col_stats=col_stats, normalise=normalise, fwd_labels=fwd_labels, next_pow2=triton.next_power_of_2
    )
    return _KERNELS


_STATS_ROWS, _NORM_BLOCK, _LABEL_BLOCK = 16, 1024, 1024


def _fused_normalise(
    values: torch.Tensor, col_idx: torch.Tensor, ts0: int, n_tr: int, m: int, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(x, mean, var, std, non-finite input count) by the Triton kernels, or None (torch path)."""
    if (
        values.device.type != "cuda"
        or values.stride(1) != 1
        or values.dtype not in (torch.float32, torch.bfloat16)
    ):
        return None
    ker = _kernels()
    if ker is None:
        return None
    try:
        width, stride, f = int(values.shape[1]), int(values.stride(0)), int(col_idx.numel())
        block_c = ker["next_pow2"](width)
        n_prog = min(
            8 * torch.cuda.get_device_properties(values.device).multi_processor_count,
            max(1, math.ceil(n_tr / _STATS_ROWS)),
        )
        rows_per_prog = math.ceil(math.ceil(n_tr / n_prog) / _STATS_ROWS) * _STATS_ROWS
        n_prog = math.ceil(n_tr / rows_per_prog)
        k = values[ts0].to(torch.float64)
        part = torch.empty((n_prog, 2, block_c), dtype=torch.float64, device=values.device)
        ker["col_stats"][(n_prog,)](
            values,
            k,
            part,
            ts0,
            n_tr,
            stride,
            width,
            rows_per_prog,
            BLOCK_R=_STATS_ROWS,
            BLOCK_C=block_c,
            num_warps=4,
        )
        tot = part.sum(dim=0)[:, :width]
        d1 = tot[0] / n_tr
        mean_all = k + d1
        var_all = torch.clamp(tot[1] / n_tr - d1 * d1, min=0.0)
        mean, var = mean_all[col_idx], var_all[col_idx]
        std = var.sqrt()
        std = torch.where(std > cfg.std_floor, std, torch.ones_like(std))
        inv = std.reciprocal()
        x = torch.empty((m, f), dtype=torch.float32, device=values.device)
        n_blk = math.ceil(m * f / _NORM_BLOCK)
        bad = torch.empty(n_blk, dtype=torch.int32, device=values.device)
        ker["normalise"][(n_blk,)](
            values,
            col_idx,
            inv.to(torch.float32),
            (-mean * inv).to(torch.float32),
            x,
            bad,
            ts0,
            m * f,
            stride,
            f,
            float(cfg.clip_z),
            BLOCK=_NORM_BLOCK,
            num_warps=4,
        )
        return x, mean, var, std, bad.sum()
    except Exception as exc:  # a build/launch failure of the kernels: keep going on the torch path
        _FUSED_STATE.update(enabled=False, error=f"{type(exc).__name__}: {exc}")
        _KERNELS.clear()
        warnings.warn(f"fold_transition: fused kernels disabled ({exc}); using torch ops", stacklevel=3)
        return None


def _fused_labels(
    close: torch.Tensor, horizons: Sequence[int], lag: int, n_tr: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(r1, blended, [undefined blended, undefined r1 in training rows, bad closes]) in one kernel."""
    ker = _kernels()
    if ker is None or close.device.type != "cuda" or close.dtype != torch.float64:
        return None
    try:
        hs = tuple(int(h) for h in horizons)
        h_max = labels.max_horizon(hs, lag) - lag  # validates horizons and lag
        n = int(close.shape[0])
        r1 = torch.empty(n, dtype=torch.float64, device=close.device)
        bl = torch.empty(n, dtype=torch.float64, device=close.device)
        n_blk = math.ceil(n / _LABEL_BLOCK)
        cnt = torch.empty((n_blk, 3), dtype=torch.int32, device=close.device)
        hs_t = torch.tensor(hs, dtype=torch.int64).to(close.device, non_blocking=True)
        den = torch.tensor([math.sqrt(h) for h in hs], dtype=torch.float64).to(
            close.device, non_blocking=True
        )
        ker["fwd_labels"][(n_blk,)](
            close,
            r1,
            bl,
            cnt,
            hs_t,
            den,
            close.stride(0),
            n,
            n_tr,
            lag,
            h_max,
            N_H=len(hs),
            BLOCK=_LABEL_BLOCK,
            num_warps=4,
        )
        return r1, bl, cnt.sum(dim=0)
    except Exception as exc:  # as in _fused_normalise: fall back to torch ops
        _FUSED_STATE.update(enabled=False, error=f"{type(exc).__name__}: {exc}")
        _KERNELS.clear()
        warnings.warn(f"fold_transition: fused kernels disabled ({exc}); using torch ops", stacklevel=3)
        return None


# ---------------------------------------------------------------------------- fold transition
def input_column_indices(store_slice: DeviceSlice, cfg: TrainConfig) -> tuple[tuple[str, ...], list[int]]:
    """Model input columns: ``cfg.input_columns`` or every column not stored as a price.

    Raw price levels (:data:`DEFAULT_PRICE_COLUMNS`) are refused even when named explicitly: a
    z-scored price level still carries the regime of the training window into the states.
    """
    if cfg.input_columns is None:
        names = tuple(c for c in store_slice.columns if c not in store_slice.price_columns)
    else:
        names = tuple(cfg.input_columns)
        leaked = [c for c in names if c in DEFAULT_PRICE_COLUMNS or c == CLOSE_COLUMN]
        if leaked:
            raise FxDataError(f"input columns {leaked} are raw price columns of {store_slice.keys}")
    if not names:
        raise FxDataError(f"no input columns in {store_slice.keys}")
    return names, [store_slice.column_index(c) for c in names]


def fold_transition(
    store_slice: DeviceSlice,
    fold_range: FoldRangeLike,
    cfg: TrainConfig,
    sessions: npt.NDArray[np.int32] | None = None,
    segments: npt.NDArray[np.integer[Any]] | torch.Tensor | None = None,
) -> FoldData:
    """Build one fold's inputs and labels on the device (see module docstring).

    ``sessions`` (int32 session day per slice row) defaults to ``calendar.session_day(ts)``.
    ``segments`` (one id per slice row, e.g. the contract's instrument_id) marks price series
    that must not be differenced: a label whose horizon spans a change of segment (a contract
    roll) is undefined (NaN), and such training rows are left out of the supervised loss and
    earn nothing in the DQN environment. Without ``segments`` every training label must be
    defined (finite prices and the purge guarantee it), else FxDataError.
    """
    ts0, te, vs, ve = (
        int(fold_range.train_start),
        int(fold_range.train_end),
        int(fold_range.val_start),
        int(fold_range.val_end),
    )
    n = store_slice.n_rows
    where = f"fold {store_slice.keys} [{ts0}:{te}) / [{vs}:{ve})"
    if not (0 <= ts0 < te <= vs < ve <= n):
        raise FxDataError(f"{where}: ranges out of order or outside the {n}-row slice")
    # The purge must already be in the FoldRange: the last training label ends before val_start.
    if vs - te < cfg.purge_bars:
        raise FxDataError(
            f"{where}: gap {vs - te} bars < label reach {cfg.purge_bars} (entry lag + max horizon): "
            "training labels would read validation prices"
        )
    names, idx = input_column_indices(store_slice, cfg)
    dev = store_slice.device
    col_idx = torch.tensor(idx, dtype=torch.long, device=dev)
    n_tr = te - ts0
    v0 = vs - ts0

    # No host sync until the checks below: every step is a device op queued behind the last.
    fused = _fused_normalise(store_slice.values, col_idx, ts0, n_tr, ve - ts0, cfg)
    block: torch.Tensor | None = None
    if fused is not None:
        x, mean, var, std, n_bad_inputs = fused
    else:
        block = store_slice.values[ts0:ve].index_select(1, col_idx)
        if block.dtype != torch.float32:
            block = block.to(torch.float32)
        # float64 statistics of the training rows (one Welford reduction over the widened block)
        var, mean = torch.var_mean(block[:n_tr].to(torch.float64), dim=0, correction=0)
        std = var.sqrt()
        std = torch.where(std > cfg.std_floor, std, torch.ones_like(std))
        inv = std.reciprocal()
        # x = (block - mean) / std in one fused pass, then clipped in place
        x = torch.addcmul((-mean * inv).to(torch.float32), block, inv.to(torch.float32)).clamp_(
            -cfg.clip_z, cfg.clip_z
        )
        # a NaN/Inf validation input makes its column's sum non-finite (a sum that merely
        # overflows float32 is sorted out by the slow path below)
        n_bad_inputs = (~torch.isfinite(block[v0:].sum(dim=0))).sum()

    close = store_slice.close[ts0:ve]  # labels never read a price past val_end
    lab = _fused_labels(close, cfg.horizons, cfg.entry_lag, n_tr) if fused is not None else None
    lab_counts: torch.Tensor | None = None
    if lab is not None:
        r1, blended, kc = lab
        if segments is None:  # [target, r1, close] counts straight from the kernel
            lab_counts = torch.stack([kc[0] if cfg.target == "blended" else kc[1], kc[1], kc[2]])
    else:
        r1, blended = _labels(close, cfg.horizons, cfg.entry_lag)
    if segments is not None:
        r1, blended = _mask_segment_crossings(segments, ts0, ve, n, r1, blended, cfg, where)
    target = blended if cfg.target == "blended" else r1
    if lab_counts is None:
        lab_counts = torch.stack(
            [
                (~torch.isfinite(target[:n_tr])).sum(),
                (~torch.isfinite(r1[:n_tr])).sum(),
                (~(torch.isfinite(close) & (close > 0))).sum(),
            ]
        )

    # One host sync for all checks. A NaN/Inf training input makes its column's mean/var
    # non-finite, which is far cheaper than an elementwise isfinite.
    checks = torch.cat(
        [
            (~(torch.isfinite(mean) & torch.isfinite(var))).sum().view(1),
            n_bad_inputs.to(torch.long).view(1),
            lab_counts.to(torch.long),
        ]
    ).tolist()
    if checks[4]:
        j = int(torch.nonzero(~(torch.isfinite(close) & (close > 0)))[0, 0])
        raise FxDataError(
            f"{where}: close must be finite and > 0; slice row {ts0 + j} has {float(close[j])!r}"
        )
    if checks[0] or checks[1]:  # slow path, only to name the first bad value
        if block is None:
            block = store_slice.values[ts0:ve].index_select(1, col_idx).to(torch.float32)
        bad = torch.nonzero(~torch.isfinite(block)).cpu().numpy()
        bad = bad[(bad[:, 0] < n_tr) | (bad[:, 0] >= v0)]
        if bad.shape[0]:
            r, c = int(bad[0, 0]), int(bad[0, 1])
            raise FxDataError(f"{where}: column {names[c]!r} is NaN/Inf at slice row {ts0 + r}")
    if (checks[2] or checks[3]) and segments is None:
        raise FxDataError(f"{where}: {max(checks[2], checks[3])} training labels undefined (purge/prices)")

    val_ts = store_slice.ts[vs:ve]
    if sessions is None:
        val_sessions = calendar.session_day(val_ts).astype(np.int32)
        train_sessions = calendar.session_day(store_slice.ts[ts0:te]).astype(np.int32)
    else:
        if sessions.shape[0] != n:
            raise FxDataError(f"{where}: {sessions.shape[0]} session ids for {n} slice rows")
        val_sessions = np.asarray(sessions[vs:ve], dtype=np.int32)
        train_sessions = np.asarray(sessions[ts0:te], dtype=np.int32)

    return FoldData(
        keys=store_slice.keys,
        bounds=(ts0, te, vs, ve),
        columns=names,
        mean=mean,
        std=std,
        x_train=x[:n_tr],
        y_train=target[:n_tr],
        r1_train=r1[:n_tr],
        x_val=x[v0:],
        y_val=target[v0:],
        r1_val=r1[v0:],
        val_ts=val_ts,
        val_sessions=val_sessions,
        train_sessions=train_sessions,
        horizons=tuple(cfg.horizons),
        entry_lag=cfg.entry_lag,
        target=cfg.target,
        extra={"train_labels_undefined": int(max(checks[2], checks[3])), "fused_kernels": fused is not None},
    )


def _mask_segment_crossings(
    segments: npt.NDArray[np.integer[Any]] | torch.Tensor,
    ts0: int,
    ve: int,
    n: int,
    r1: torch.Tensor,
    blended: torch.Tensor,
    cfg: TrainConfig,
    where: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN the labels whose price window ``[j+d, j+d+h]`` contains a change of segment."""
    seg = torch.as_tensor(segments, device=r1.device)
    if seg.ndim != 1 or seg.shape[0] != n:
        raise FxDataError(f"{where}: segments shape {tuple(seg.shape)}, want ({n},)")
    seg = seg[ts0:ve]
    # change count: c[k] = number of segment changes in rows 1..k, so a window [a, b] spans a change
    # iff c[b] != c[a] (also for ids that come back later, e.g. A B A)
    c = torch.cat([seg.new_zeros(1, dtype=torch.long), torch.cumsum((seg[1:] != seg[:-1]).long(), 0)])
    d, m = cfg.entry_lag, seg.shape[0]
    nan = torch.tensor(float("nan"), dtype=r1.dtype, device=r1.device)

    def spans(h: int) -> torch.Tensor:
        out = torch.zeros(m, dtype=torch.bool, device=r1.device)
        k = m - d - h
        if k > 0:
            out[:k] = c[d + h :] != c[d : d + k]
        return out

    return torch.where(spans(1), nan, r1), torch.where(spans(max(cfg.horizons)), nan, blended)


def selection_split(fold: FoldData, cfg: TrainConfig) -> tuple[int, int]:
    """(fit_end, inner_start) in training-row indices.

    With ``early_stopping='inner'`` the model is fitted on ``[0, fit_end)`` and selected on
    ``[inner_start, n_train)``; ``inner_start - fit_end`` is the label reach, so no fitted label
    reads an inner-block price. With ``'validation'`` it fits on every training row.
    """
    n_tr = int(fold.x_train.shape[0])
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
        "total_return": float(ret.sum()),
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
    )


def load_state(path: Path | str, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Read a safetensors checkpoint (for ``model.load_state_dict``)."""
    return load_file(str(path), device=str(device))


def sidecar_base(
    fold: FoldData, cfg: TrainConfig, input_keys: Sequence[str], arch: dict[str, Any]
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
