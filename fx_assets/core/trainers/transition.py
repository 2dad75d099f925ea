"""The fold transition: a resident slice + a fold's index ranges -> the fold's inputs and labels.

Owns the one place where a fold's model inputs and labels come into being (DESIGN §4, §6), on
the code path the ``trained_model`` asset runs. :func:`fold_transition` takes a resident
:class:`~fx_assets.core.device_store.DeviceSlice` and a fold's half-open index ranges and, with
device ops and no host sync before its checks, (1) slices the input columns of
``[train_start, val_end)`` (price columns are never inputs: raw price levels leaked the future
regime into states once), (2) computes z-score statistics from the *training rows only*,
(3) derives the 1-bar forward return and the blended multi-horizon target from the float64
close column restricted to ``[train_start, val_end)`` — so no label can read a price beyond the
validation quarter — masking every label whose window spans a contract roll, and (4) checks,
with one host sync at the end, that the purge holds, that every training label is defined
(unless contract segments mark rolls), that every close is finite and positive, and that no
input is NaN/Inf. The labels follow ``core.labels`` op for op (its torch functions are not
called: they sync once each to validate the close column). On CUDA, four Triton kernels (see
"fused CUDA kernels" below) do the statistics, the normalisation and the labels with the roll
mask; elsewhere torch ops do.

Nothing here is computed per fold that depends on a quarter alone: session ids, ln close and
the running contract-change count come with the slice, computed once per quarter when the
device store uploaded it, and small constant index tensors are uploaded once per process. A
fold's transition is thus a handful of kernel launches and one host sync. :func:`warm_up` runs
one small transition first, so that a run's first fold does not pay the kernel builds.
"""

from __future__ import annotations

import importlib
import math
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from fx_assets.core import labels
from fx_assets.core.device_store import CLOSE_COLUMN, DEFAULT_PRICE_COLUMNS, DeviceSlice
from fx_assets.core.errors import FxDataError
from fx_assets.core.snapshot_labels import breaks_of, half_ticks, labels_of_ticks, relative_change
from fx_assets.core.trainers.common import FoldData, FoldRangeLike, TrainConfig
from fx_assets.core.trainers.snapshot_label_kernel import fused_snapshot_labels


# ---------------------------------------------------------------------------- labels
def _labels(logc: torch.Tensor, horizons: Sequence[int], lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(1-bar forward return, blended target) from ``logc = torch.log(close)``, the formulas of
    ``core.labels`` without its syncs.

    ``labels.*_torch`` check the close column with a host sync each; here that check is one of
    the deferred checks of :func:`fold_transition`. The arithmetic is the same op for op (the
    blended target accumulates ``y^(h) / sqrt(h)`` in ``horizons`` order from zero, then divides
    by the count), so the results are bitwise those of ``core.labels``.
    """
    hs = tuple(int(h) for h in horizons)
    labels.max_horizon(hs, lag)  # validates horizons and lag (no device work)
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
# Four Triton kernels do a fold transition on CUDA in two passes over the slice (torch needs
# six, and some twenty small ops between them):
#   1. ``col_stats``: column sums of (x - k) and (x - k)^2 in float64 over the training rows
#      (k = the first training row, so the one-pass variance has no cancellation), as
#      per-program partials;
#   2. ``finalize`` (one program): adds the partials up in a fixed order (deterministic), and
#      writes mean, var, std (floored), the float32 scale and shift of the inputs, and a count of
#      non-finite statistics;
#   3. ``normalise``: gather of the input columns, (x - mean) / std, clip, and a count of
#      non-finite inputs;
#   4. ``fwd_labels``: the labels from the per-upload ln close, the roll mask, and the counts
#      of undefined training labels and bad closes.
# Every count goes to one small int32 vector (integer atomics, issued only where non-zero),
# read back with the transition's one host sync. Row counts and offsets are not specialised
# on their values, so one build serves every fold of a layout. Without Triton, on the CPU, or if a kernel
# fails to build, the torch path runs instead.
_KERNELS: dict[str, Any] = {}
_FUSED_STATE = {"enabled": os.environ.get("FX_FUSED_FOLD", "1") != "0", "error": ""}
# the check vector: [non-finite statistics, non-finite inputs, undefined blended training
# labels, undefined 1-bar training labels, closes not finite and > 0]
_N_CHECKS = 5


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

    @triton.jit(do_not_specialize=["row0", "n_rows", "rows_per_prog"])
    def col_stats(
        v_ptr,
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
        base = v_ptr + row0.to(tl.int64) * stride
        k = tl.load(base + cols, mask=cmask, other=0.0).to(tl.float64)
        # elementwise accumulators, reduced across rows once at the end
        s1 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
        s2 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
        start = pid * rows_per_prog
        end = tl.minimum(start + rows_per_prog, n_rows)
        for r0 in range(start, end, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            m = (rows < end)[:, None] & cmask[None, :]
            x = tl.load(base + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=m, other=0.0)
            d = tl.where(m, x.to(tl.float64) - k[None, :], 0.0)
            s1 += d
            s2 += d * d
        out = part_ptr + pid * 2 * BLOCK_C
        tl.store(out + cols, tl.sum(s1, axis=0))
        tl.store(out + BLOCK_C + cols, tl.sum(s2, axis=0))

    @triton.jit(do_not_specialize=["row0", "n_prog", "n_tr"])
    def finalize(
        part_ptr,
        v_ptr,
        idx_ptr,
        mean_ptr,
        var_ptr,
        std_ptr,
        scale_ptr,
        shift_ptr,
        chk_ptr,
        row0,
        stride,
        n_prog,
        n_tr,
        n_feat,
        std_floor,
        PART_W: tl.constexpr,  # type: ignore[name-defined]
        BLOCK_P: tl.constexpr,  # type: ignore[name-defined]
        BLOCK_F: tl.constexpr,  # type: ignore[name-defined]
    ):
        # one program per BLOCK_F input columns: their statistics, op for op the torch path's;
        # the partials are added in a fixed order (deterministic)
        f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
        fm = f < n_feat
        src = tl.load(idx_ptr + f, mask=fm, other=0)
        k = tl.load(v_ptr + row0.to(tl.int64) * stride + src, mask=fm, other=0.0).to(tl.float64)
        s1 = tl.zeros([BLOCK_P, BLOCK_F], dtype=tl.float64)
        s2 = tl.zeros([BLOCK_P, BLOCK_F], dtype=tl.float64)
        for p0 in range(0, n_prog, BLOCK_P):
            ps = p0 + tl.arange(0, BLOCK_P)
            m = (ps < n_prog)[:, None] & fm[None, :]
            at = part_ptr + ps[:, None] * (2 * PART_W) + src[None, :]
            s1 += tl.load(at, mask=m, other=0.0)
            s2 += tl.load(at + PART_W, mask=m, other=0.0)
        t1 = tl.sum(s1, axis=0)
        t2 = tl.sum(s2, axis=0)
        d1 = t1 / n_tr
        mean = k + d1
        v = t2 / n_tr - d1 * d1
        var = tl.where(v > 0.0, v, 0.0)
        std = tl.sqrt(var)
        std = tl.where(std > std_floor, std, 1.0)
        inv = 1.0 / std
        tl.store(mean_ptr + f, mean, mask=fm)
        tl.store(var_ptr + f, var, mask=fm)
        tl.store(std_ptr + f, std, mask=fm)
        tl.store(scale_ptr + f, inv.to(tl.float32), mask=fm)
        tl.store(shift_ptr + f, (-mean * inv).to(tl.float32), mask=fm)
        fin = (mean == mean) & (tl.abs(mean) < float("inf")) & (t2 == t2) & (tl.abs(t2) < float("inf"))
        n_bad = tl.sum((fm & ~fin).to(tl.int32), axis=0)
        tl.atomic_add(chk_ptr, n_bad, mask=n_bad > 0)

    @triton.jit(do_not_specialize=["row0", "n_out"])
    def normalise(
        v_ptr,
        idx_ptr,
        scale_ptr,
        shift_ptr,
        out_ptr,
        chk_ptr,
        row0,
        n_out,
        stride,
        n_feat,
        clip,
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        # one program per BLOCK consecutive outputs of the row-major [m, n_feat] result (no lane
        # idles on a power-of-two column tile wider than the row)
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
        n_bad = tl.sum((ok & ((x != x) | (tl.abs(x) > 3.4028234663852886e38))).to(tl.int32), axis=0)
        tl.atomic_add(chk_ptr + 1, n_bad, mask=n_bad > 0)

    @triton.jit(do_not_specialize=["cs", "n", "n_tr", "lag", "h_max"])
    def fwd_labels(
        logc_ptr,
        close_ptr,
        seg_ptr,
        r1_ptr,
        bl_ptr,
        chk_ptr,
        hs_ptr,
        den_ptr,
        cs,
        n,
        n_tr,
        lag,
        h_max,
        N_H: tl.constexpr,  # type: ignore[name-defined]
        HAS_SEG: tl.constexpr,  # type: ignore[name-defined]
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        # r1_j = L[j+d+1] - L[j+d]; blended_j = (sum_h (L[j+d+h] - L[j+d]) / sqrt h) / |H| with
        # L = ln close (the op order of core.labels); NaN where a horizon runs past the slice,
        # and (HAS_SEG) where the running contract-change count differs between the window's
        # ends (a roll)
        pid = tl.program_id(0)
        j = pid * BLOCK + tl.arange(0, BLOCK)
        inb = j < n
        c = tl.load(close_ptr + j * cs, mask=inb, other=1.0)
        bad_c = inb & ~((c == c) & (c > 0) & (c < float("inf")))
        ok_b = inb & ((j + lag) < n)
        lb = tl.load(logc_ptr + (j + lag), mask=ok_b, other=0.0)
        ok1 = inb & ((j + lag + 1) < n)
        r1 = tl.load(logc_ptr + (j + lag + 1), mask=ok1, other=0.0) - lb
        r1 = tl.where(ok1, r1, float("nan"))
        okh = inb & ((j + lag + h_max) < n)
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        for i in tl.static_range(N_H):
            h = tl.load(hs_ptr + i)
            den = tl.load(den_ptr + i)
            acc = acc + (tl.load(logc_ptr + (j + lag + h), mask=okh, other=0.0) - lb) / den
        bl = tl.where(okh, acc / N_H, float("nan"))
        if HAS_SEG:
            s0 = tl.load(seg_ptr + (j + lag), mask=ok_b, other=0)
            s1 = tl.load(seg_ptr + (j + lag + 1), mask=ok1, other=0)
            sh = tl.load(seg_ptr + (j + lag + h_max), mask=okh, other=0)
            r1 = tl.where(s1 == s0, r1, float("nan"))
            bl = tl.where(sh == s0, bl, float("nan"))
        tl.store(r1_ptr + j, r1, mask=inb)
        tl.store(bl_ptr + j, bl, mask=inb)
        tr = inb & (j < n_tr)
        n_bl = tl.sum((tr & ~((bl == bl) & (tl.abs(bl) < float("inf")))).to(tl.int32), axis=0)
        n_r1 = tl.sum((tr & ~((r1 == r1) & (tl.abs(r1) < float("inf")))).to(tl.int32), axis=0)
        n_c = tl.sum(bad_c.to(tl.int32), axis=0)
        tl.atomic_add(chk_ptr + 2, n_bl, mask=n_bl > 0)
        tl.atomic_add(chk_ptr + 3, n_r1, mask=n_r1 > 0)
        tl.atomic_add(chk_ptr + 4, n_c, mask=n_c > 0)

    _KERNELS.update(
        col_stats=col_stats,
        finalize=finalize,
        normalise=normalise,
        fwd_labels=fwd_labels,
        next_pow2=triton.next_power_of_2,
    )
    return _KERNELS


# launch shapes (tuned on the H200 by benchmarks/bench_gpu_kernels.py)
TUNING: dict[str, int] = {
    "stats_rows": 8,  # rows per inner step of col_stats
    "stats_progs_per_sm": 8,  # col_stats programs per multiprocessor
    "stats_warps": 4,
    "norm_block": 512,  # outputs per normalise program
    "norm_warps": 4,
    "label_block": 1024,  # rows per fwd_labels program
    "part_block": 128,  # partials per step of finalize
    "final_cols": 8,  # input columns per finalize program
}
_CONSTS: dict[tuple[str, tuple[float, ...], torch.dtype], torch.Tensor] = {}
_SMS: dict[str, int] = {}


def _const(dev: torch.device, values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """A small constant tensor on ``dev``, uploaded once per process (not once per fold)."""
    key = (str(dev), tuple(values), dtype)
    t = _CONSTS.get(key)
    if t is None:
        t = _CONSTS[key] = torch.tensor(list(values), dtype=dtype).to(dev)
    return t


def _sm_count(dev: torch.device) -> int:
    key = str(dev)
    if key not in _SMS:
        _SMS[key] = int(torch.cuda.get_device_properties(dev).multi_processor_count)
    return _SMS[key]


def _kernel_failed(exc: Exception) -> None:
    """A build/launch failure of the kernels: warn once and keep going on the torch path."""
    _FUSED_STATE.update(enabled=False, error=f"{type(exc).__name__}: {exc}")
    _KERNELS.clear()
    warnings.warn(f"fold_transition: fused kernels disabled ({exc}); using torch ops", stacklevel=4)


def _fused_normalise(
    values: torch.Tensor,
    col_idx: torch.Tensor,
    ts0: int,
    n_tr: int,
    m: int,
    cfg: TrainConfig,
    chk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(x, mean, var, std) by the Triton kernels, counts into ``chk``; or None (torch path)."""
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
        dev = values.device
        width, stride, f = int(values.shape[1]), int(values.stride(0)), int(col_idx.numel())
        block_c = ker["next_pow2"](width)
        sr = TUNING["stats_rows"]
        n_prog = min(TUNING["stats_progs_per_sm"] * _sm_count(dev), max(1, math.ceil(n_tr / sr)))
        rows_per_prog = math.ceil(math.ceil(n_tr / n_prog) / sr) * sr
        n_prog = math.ceil(n_tr / rows_per_prog)
        part = torch.empty((n_prog, 2, block_c), dtype=torch.float64, device=dev)
        ker["col_stats"][(n_prog,)](
            values, part, ts0, n_tr, stride, width, rows_per_prog,
            BLOCK_R=sr, BLOCK_C=block_c, num_warps=TUNING["stats_warps"],
        )  # fmt: skip
        stats = torch.empty((3, f), dtype=torch.float64, device=dev)  # mean, var, std
        affine = torch.empty((2, f), dtype=torch.float32, device=dev)  # scale, shift
        fc = TUNING["final_cols"]
        ker["finalize"][(math.ceil(f / fc),)](
            part, values, col_idx, stats[0], stats[1], stats[2], affine[0], affine[1], chk,
            ts0, stride, n_prog, n_tr, f, float(cfg.std_floor),
            PART_W=block_c, BLOCK_P=TUNING["part_block"], BLOCK_F=fc, num_warps=4,
        )  # fmt: skip
        x = torch.empty((m, f), dtype=torch.float32, device=dev)
        nb = TUNING["norm_block"]
        ker["normalise"][(math.ceil(m * f / nb),)](
            values, col_idx, affine[0], affine[1], x, chk, ts0, m * f, stride, f, float(cfg.clip_z),
            BLOCK=nb, num_warps=TUNING["norm_warps"],
        )  # fmt: skip
        return x, stats[0], stats[1], stats[2]
    except Exception as exc:
        _kernel_failed(exc)
        return None


def _fused_labels(
    logc: torch.Tensor,
    close: torch.Tensor,
    seg: torch.Tensor | None,
    horizons: Sequence[int],
    lag: int,
    n_tr: int,
    chk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(r1, blended) in one kernel from ``logc`` (ln ``close``), counts into ``chk``; ``seg``
    (int32 running change counts of the same rows, contiguous) masks labels across rolls."""
    ker = _kernels()
    if ker is None or close.device.type != "cuda" or close.dtype != torch.float64:
        return None
    if logc.dtype != torch.float64 or logc.stride(0) != 1:
        return None
    if seg is not None and (seg.dtype != torch.int32 or seg.stride(0) != 1):
        return None
    try:
        hs = tuple(int(h) for h in horizons)
        h_max = labels.max_horizon(hs, lag) - lag  # validates horizons and lag
        n = int(close.shape[0])
        out = torch.empty((2, n), dtype=torch.float64, device=close.device)
        hs_t = _const(close.device, hs, torch.int64)
        den = _const(close.device, tuple(math.sqrt(h) for h in hs), torch.float64)
        ker["fwd_labels"][(math.ceil(n / TUNING["label_block"]),)](
            logc, close, seg if seg is not None else logc, out[0], out[1], chk, hs_t, den,
            close.stride(0), n, n_tr, lag, h_max,
            N_H=len(hs), HAS_SEG=seg is not None, BLOCK=TUNING["label_block"], num_warps=4,
        )  # fmt: skip
        return out[0], out[1]
    except Exception as exc:
        _kernel_failed(exc)
        return None


def block_labels(
    close: torch.Tensor, changes: torch.Tensor | None, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(1-bar return, blended target) of rows with float64 ``close`` (and ``changes``, their
    running segment-change counts, int32): on CUDA the resident path's ``fwd_labels`` kernel,
    elsewhere (or if it fails) :func:`labels_of`, both from ``ln close`` as the store computes it.
    What a streamed block runs over its rows and look-ahead."""
    logc = torch.log(close)
    if close.device.type == "cuda":
        chk = torch.zeros(_N_CHECKS, dtype=torch.int32, device=close.device)
        seg = changes.contiguous() if changes is not None else None
        lab = _fused_labels(logc, close, seg, cfg.horizons, cfg.entry_lag, 0, chk)
        if lab is not None:
            return lab
    return labels_of(logc, changes, cfg)


# ---------------------------------------------------------------------------- fold transition
def input_column_indices(store_slice: DeviceSlice, cfg: TrainConfig) -> tuple[tuple[str, ...], list[int]]:
    """Model input columns: ``cfg.input_columns`` or every column not stored as a price.

    Raw price levels (:data:`DEFAULT_PRICE_COLUMNS`) are refused even when named explicitly: a
    z-scored price level still carries the regime of the training window into the states.
    """
    return select_inputs(store_slice.columns, store_slice.price_columns, store_slice.keys, cfg)


def select_inputs(
    columns: Sequence[str], price_columns: Sequence[str], keys: Sequence[str], cfg: TrainConfig
) -> tuple[tuple[str, ...], list[int]]:
    """:func:`input_column_indices` from the column names of a value block and its price block
    (the streamed path has no slice)."""
    columns = tuple(columns)
    if cfg.input_columns is None:
        names = tuple(c for c in columns if c not in price_columns)
    else:
        names = tuple(cfg.input_columns)
        leaked = [c for c in names if c in DEFAULT_PRICE_COLUMNS or c == CLOSE_COLUMN]
        if leaked:
            raise FxDataError(f"input columns {leaked} are raw price columns of {tuple(keys)}")
    if not names:
        raise FxDataError(f"no input columns in {tuple(keys)}")
    missing = [c for c in names if c not in columns]
    if missing:
        raise FxDataError(f"column {missing[0]!r} not in fxcache columns of {tuple(keys)}")
    return names, [columns.index(c) for c in names]


def floor_std(var: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """The per-column std of the normalisation: ``sqrt(var)``, 1 where it is not above
    ``cfg.std_floor`` (such a column is centred only)."""
    std = var.sqrt()
    return torch.where(std > cfg.std_floor, std, torch.ones_like(std))


def normalise(block: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """``clip((block - mean) / std)`` in float32, as one fused multiply-add: the torch path of
    :func:`fold_transition` and every streamed block (same op, same bits)."""
    inv = std.reciprocal()
    return torch.addcmul((-mean * inv).to(torch.float32), block, inv.to(torch.float32)).clamp_(
        -cfg.clip_z, cfg.clip_z
    )


def normalise_values(
    values: torch.Tensor, col_idx: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, cfg: TrainConfig
) -> torch.Tensor:
    """The normalised inputs of raw value rows ``values`` ([m, w] float32 | bfloat16, the input
    columns at ``col_idx``): on CUDA the resident path's ``normalise`` kernel (same gather, same
    float32 affine from ``mean`` / ``std``, same arithmetic), elsewhere (or if it fails) the torch
    gather and :func:`normalise`. What a streamed block runs."""
    m, f = int(values.shape[0]), int(col_idx.numel())
    ker = _kernels() if values.device.type == "cuda" else None
    if ker is not None and values.stride(1) == 1 and values.dtype in (torch.float32, torch.bfloat16) and m:
        try:
            inv = 1.0 / std  # the finalize kernel's affine: 1 / std, -mean / std, in float32
            scale, shift = inv.to(torch.float32), (-mean * inv).to(torch.float32)
            x = torch.empty((m, f), dtype=torch.float32, device=values.device)
            chk = torch.zeros(_N_CHECKS, dtype=torch.int32, device=values.device)
            nb = TUNING["norm_block"]
            ker["normalise"][(math.ceil(m * f / nb),)](
                values, col_idx, scale, shift, x, chk, 0, m * f, int(values.stride(0)), f, float(cfg.clip_z),
                BLOCK=nb, num_warps=TUNING["norm_warps"],
            )  # fmt: skip
            return x
        except Exception as exc:
            _kernel_failed(exc)
    block = values.index_select(1, col_idx)
    return normalise(block if block.dtype == torch.float32 else block.to(torch.float32), mean, std, cfg)


def labels_of(
    logc: torch.Tensor, changes: torch.Tensor | None, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(1-bar return, blended target) of the rows of ``logc`` (ln close), NaN where a horizon
    runs past its end or (``changes``: running segment-change counts of the same rows) spans a
    roll: the torch path of :func:`fold_transition`, also what each streamed block runs over its
    rows and look-ahead."""
    r1, blended = _labels(logc, cfg.horizons, cfg.entry_lag)
    if changes is not None:
        r1, blended = _mask_segment_crossings(changes, r1, blended, cfg)
    return r1, blended


def fold_transition(
    store_slice: DeviceSlice,
    fold_range: FoldRangeLike,
    cfg: TrainConfig,
    sessions: npt.NDArray[np.int32] | None = None,
    segments: npt.NDArray[np.integer[Any]] | torch.Tensor | None = None,
) -> FoldData:
    """Build one fold's inputs and labels on the device (see module docstring).

    ``sessions`` (int32 session day per slice row) defaults to the slice's own, computed once
    per quarter when it was uploaded. ``segments`` (one id per slice row, e.g. the contract's
    instrument_id) marks price series that must not be differenced; by default the slice's
    ``contract`` price column does (its running change count, also computed at upload). A label
    whose horizon spans a change of segment (a contract roll) is undefined (NaN), and such
    training rows are left out of the supervised loss and earn nothing in the DQN environment.
    Without segments every training label must be defined (finite prices and the purge
    guarantee it), else FxDataError.
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
    if store_slice.row_unit != cfg.row_unit:
        raise FxDataError(
            f"{where}: the fxcache rows are {store_slice.row_unit!r} rows, the trainer config expects "
            f"{cfg.row_unit!r} rows (pipeline fxcache.row_unit and the files disagree)"
        )
    sess = store_slice.sessions if sessions is None else np.asarray(sessions)
    if sess.shape[0] != n:
        raise FxDataError(f"{where}: {sess.shape[0]} session ids for {n} slice rows")
    changes = (
        store_slice.segment_changes
        if segments is None
        else _changes_of(segments, n, store_slice.device, where)
    )
    names, idx = input_column_indices(store_slice, cfg)
    dev = store_slice.device
    col_idx = _const(dev, idx, torch.long)
    n_tr = te - ts0
    v0 = vs - ts0

    # No host sync until the checks below: every step is a device op queued behind the last.
    # The check counts (see _N_CHECKS) gather in one int32 vector, read back once.
    chk = torch.zeros(_N_CHECKS, dtype=torch.int32, device=dev)
    fused = _fused_normalise(store_slice.values, col_idx, ts0, n_tr, ve - ts0, cfg, chk)
    block: torch.Tensor | None = None
    if fused is not None:
        x, mean, var, std = fused
    else:
        block = store_slice.values[ts0:ve].index_select(1, col_idx)
        if block.dtype != torch.float32:
            block = block.to(torch.float32)
        # float64 statistics of the training rows (one Welford reduction over the widened block)
        var, mean = torch.var_mean(block[:n_tr].to(torch.float64), dim=0, correction=0)
        std = floor_std(var, cfg)
        x = normalise(block, mean, std, cfg)  # (block - mean) / std in one fused pass, clipped
        # A NaN/Inf training input makes its column's mean/var non-finite, a validation one
        # its column's sum (a sum that merely overflows float32 is sorted out by the slow path).
        chk[0] += (~(torch.isfinite(mean) & torch.isfinite(var))).sum().to(torch.int32)
        chk[1] += (~torch.isfinite(block[v0:].sum(dim=0))).sum().to(torch.int32)

    def fold_data(
        target: torch.Tensor,
        r1: torch.Tensor,
        *,
        horizons: tuple[int, ...],
        entry_lag: int,
        target_name: str,
        extra: dict[str, Any],
    ) -> FoldData:
        """The fold's rows cut at the purge (training rows, then validation from ``v0``): one
        construction for both row units, which differ only in their labels."""
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
            val_ts=store_slice.ts[vs:ve],
            val_sessions=np.asarray(sess[vs:ve], dtype=np.int32),
            train_sessions=np.asarray(sess[ts0:te], dtype=np.int32),
            horizons=horizons,
            entry_lag=entry_lag,
            target=target_name,
            extra=extra,
        )

    if store_slice.row_unit == "snapshot":
        target, r1, extra = snapshot_fold_labels(store_slice, ts0, ve, n_tr, cfg, where)
        bad_stats, bad_inputs = chk[:2].tolist()  # the one host sync of the input checks
        if bad_stats or bad_inputs:
            _raise_bad_input(store_slice, col_idx, names, ts0, ve, n_tr, v0, block, where)
        return fold_data(
            target,
            r1,
            horizons=(cfg.train_horizon,),
            entry_lag=0,
            target_name=f"snapshot_h{cfg.train_horizon}",
            extra={**extra, "fused_kernels": fused is not None},
        )

    close = store_slice.close[ts0:ve]  # labels never read a price past val_end
    full_logc = store_slice.log_close
    logc = full_logc[ts0:ve] if full_logc is not None else torch.log(close)
    seg = changes[ts0:ve] if changes is not None else None
    lab = (
        _fused_labels(logc, close, seg, cfg.horizons, cfg.entry_lag, n_tr, chk) if fused is not None else None
    )
    if lab is not None:
        r1, blended = lab  # the roll mask and the counts are the kernel's
    else:
        r1, blended = labels_of(logc, seg, cfg)
        chk[2] += (~torch.isfinite(blended[:n_tr])).sum().to(torch.int32)
        chk[3] += (~torch.isfinite(r1[:n_tr])).sum().to(torch.int32)
        chk[4] += (~(torch.isfinite(close) & (close > 0))).sum().to(torch.int32)
    target = blended if cfg.target == "blended" else r1

    # The one host sync, for all checks.
    bad_stats, bad_inputs, bad_blended, bad_r1, bad_close = chk.tolist()
    bad_target = bad_blended if cfg.target == "blended" else bad_r1
    if bad_close:
        j = int(torch.nonzero(~(torch.isfinite(close) & (close > 0)))[0, 0])
        raise FxDataError(
            f"{where}: close must be finite and > 0; slice row {ts0 + j} has {float(close[j])!r}"
        )
    if bad_stats or bad_inputs:  # slow path, only to name the first bad value
        _raise_bad_input(store_slice, col_idx, names, ts0, ve, n_tr, v0, block, where)
    if (bad_target or bad_r1) and seg is None:
        raise FxDataError(f"{where}: {max(bad_target, bad_r1)} training labels undefined (purge/prices)")

    return fold_data(
        target,
        r1,
        horizons=tuple(cfg.horizons),
        entry_lag=cfg.entry_lag,
        target_name=cfg.target,
        extra={"train_labels_undefined": int(max(bad_target, bad_r1)), "fused_kernels": fused is not None},
    )


def _raise_bad_input(
    store_slice: DeviceSlice,
    col_idx: torch.Tensor,
    names: Sequence[str],
    ts0: int,
    ve: int,
    n_tr: int,
    v0: int,
    block: torch.Tensor | None,
    where: str,
) -> None:
    """Name the first NaN/Inf model input of the fold's training or validation rows."""
    if block is None:
        block = store_slice.values[ts0:ve].index_select(1, col_idx).to(torch.float32)
    bad = torch.nonzero(~torch.isfinite(block)).cpu().numpy()
    bad = bad[(bad[:, 0] < n_tr) | (bad[:, 0] >= v0)]
    if bad.shape[0]:
        r, c = int(bad[0, 0]), int(bad[0, 1])
        raise FxDataError(f"{where}: column {names[c]!r} is NaN/Inf at slice row {ts0 + r}")


def snapshot_fold_labels(
    store_slice: DeviceSlice, ts0: int, ve: int, n_tr: int, cfg: TrainConfig, where: str
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Labels of a snapshot fold's rows ``[ts0, ve)`` on the device, from the exact f64 ``mid``
    (``core.snapshot_labels``; never past val_end, never across a change of the ``session`` or
    ``contract`` price column): (training target = the class of ``cfg.train_horizon``, ±1, 0 as
    a third class or NaN where excluded / undefined; the 1-row relative mid change, the reward
    of a position held one update; extra: the row unit, the horizon, the zero-move share of the
    training rows and every horizon's classes of the validation rows, for evaluation)."""
    tick = store_slice.price_tick
    if tick is None:
        raise FxDataError(f"{where}: snapshot labels need the instrument tick (DeviceStore price_tick)")
    mid = store_slice.price("mid")[ts0:ve]
    ids = [store_slice.price(c)[ts0:ve] for c in ("session", "contract") if c in store_slice.price_columns]
    if not ids:
        raise FxDataError(f"{where}: snapshot rows need a session or contract price column (breaks)")
    br = breaks_of(*ids)
    lab_cfg = cfg.snapshot_labels()
    u = half_ticks(mid, tick)  # once per fold: the grid check is a host sync
    fused = fused_snapshot_labels(u, br, n_tr, lab_cfg)  # one kernel on CUDA, else None
    if fused is not None:
        labs, r1 = fused
    else:
        labs = labels_of_ticks(u, n_tr, lab_cfg, br)
        r1 = relative_change(u, br, 1, "unsmoothed", 1)
    by_h = {hl.horizon: hl for hl in labs}
    main = by_h[cfg.train_horizon]
    extra: dict[str, Any] = {
        "row_unit": "snapshot",
        "train_horizon": cfg.train_horizon,
        "label_form": lab_cfg.form,
        "zero_handling": lab_cfg.zero,
        "zero_move_share": main.shares["stationary"],
        "train_labels_defined_share": main.shares["defined"],
        "alpha": main.alpha,
        "horizon_shares": {hl.horizon: dict(hl.shares) for hl in labs},
        "horizon_alpha": {hl.horizon: hl.alpha for hl in labs},
        "classes": {hl.horizon: hl.classes for hl in labs},  # [ts0, ve) rows, every horizon
        "train_labels_undefined": n_tr - main.train_defined,
        "fused_labels": fused is not None,
    }
    return main.classes, r1, extra


def _changes_of(
    segments: npt.NDArray[np.integer[Any]] | torch.Tensor, n: int, dev: torch.device, where: str
) -> torch.Tensor:
    """Running count of segment changes (int32, on ``dev``) of one id per slice row."""
    seg = torch.as_tensor(segments, device=dev)
    if seg.ndim != 1 or seg.shape[0] != n:
        raise FxDataError(f"{where}: segments shape {tuple(seg.shape)}, want ({n},)")
    c = torch.zeros(n, dtype=torch.int32, device=dev)
    if n > 1:
        c[1:] = torch.cumsum(seg[1:] != seg[:-1], 0, dtype=torch.int32)
    return c


def _mask_segment_crossings(
    c: torch.Tensor, r1: torch.Tensor, blended: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN the labels whose price window ``[j+d, j+d+h]`` contains a change of segment.

    ``c`` is the running change count of the fold's rows: a window [a, b] spans a change iff
    c[b] != c[a] (also for ids that come back later, e.g. A B A)."""
    d, m = cfg.entry_lag, c.shape[0]
    nan = torch.tensor(float("nan"), dtype=r1.dtype, device=r1.device)

    def spans(h: int) -> torch.Tensor:
        out = torch.zeros(m, dtype=torch.bool, device=r1.device)
        k = m - d - h
        if k > 0:
            out[:k] = c[d + h :] != c[d : d + k]
        return out

    return torch.where(spans(1), nan, r1), torch.where(spans(max(cfg.horizons)), nan, blended)


def warm_up(store_slice: DeviceSlice, cfg: TrainConfig) -> float:
    """Run one small fold transition on the first rows of ``store_slice`` and return its seconds.

    The first launch of each Triton kernel in a process builds it (or loads it from Triton's
    disk cache): a run calls this once before its first fold, so that cost is reported as the
    run's kernel warm-up instead of inflating one fold's transition. The kernels are not
    specialised on integer arguments, so this build serves every fold of the same layout.
    """
    reach = int(cfg.purge_bars)
    n_tr = max(64, 2 * reach)
    n = min(store_slice.n_rows, n_tr + reach + 64)
    t0 = time.perf_counter()
    if n >= n_tr + reach + 2:
        small = _WarmRange(0, n_tr, n_tr + reach, n)
        try:
            fold_transition(store_slice, small, cfg)
        except FxDataError:
            pass  # the real folds report their own data errors
    return time.perf_counter() - t0


class _WarmRange(NamedTuple):
    """The fold range of :func:`warm_up` (a FoldRangeLike)."""

    train_start: int
    train_end: int
    val_start: int
    val_end: int
