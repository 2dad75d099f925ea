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
called: they sync once each to validate the close column). On CUDA, three Triton kernels (see
"fused CUDA kernels" below) do the statistics, the normalisation and the labels with the roll
mask; elsewhere torch ops do.

Nothing here is computed per fold that depends on a quarter alone: session ids and the running
contract-change count come with the slice, computed once per quarter when the device store
uploaded it, and small constant index tensors are uploaded once per process. A fold's
transition is thus a handful of kernel launches and one host sync.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from fx_assets.core import labels
from fx_assets.core.device_store import CLOSE_COLUMN, DEFAULT_PRICE_COLUMNS, DeviceSlice
from fx_assets.core.errors import FxDataError
from fx_assets.core.trainers.common import FoldData, FoldRangeLike, TrainConfig


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
        seg_ptr,
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
        HAS_SEG: tl.constexpr,  # type: ignore[name-defined]
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        # r1_j = ln C[j+d+1] - ln C[j+d]; blended_j = (sum_h (ln C[j+d+h] - ln C[j+d]) / sqrt h) / |H|
        # (the op order of core.labels); NaN where a horizon runs past the slice, and (HAS_SEG)
        # where the running contract-change count differs between the window's ends (a roll)
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
        if HAS_SEG:
            s0 = tl.load(seg_ptr + (j + lag), mask=ok_b, other=0)
            s1 = tl.load(seg_ptr + (j + lag + 1), mask=ok1, other=0)
            sh = tl.load(seg_ptr + (j + lag + h_max), mask=okh, other=0)
            r1 = tl.where(s1 == s0, r1, float("nan"))
            bl = tl.where(sh == s0, bl, float("nan"))
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
_CONSTS: dict[tuple[str, tuple[float, ...], torch.dtype], torch.Tensor] = {}


def _const(dev: torch.device, values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """A small constant tensor on ``dev``, uploaded once per process (not once per fold)."""
    key = (str(dev), tuple(values), dtype)
    t = _CONSTS.get(key)
    if t is None:
        t = _CONSTS[key] = torch.tensor(list(values), dtype=dtype).to(dev)
    return t


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
    close: torch.Tensor, seg: torch.Tensor | None, horizons: Sequence[int], lag: int, n_tr: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(r1, blended, [undefined blended, undefined r1 in training rows, bad closes]) in one kernel;
    ``seg`` (int32 running change counts of the same rows, contiguous) masks labels across rolls."""
    ker = _kernels()
    if ker is None or close.device.type != "cuda" or close.dtype != torch.float64:
        return None
    if seg is not None and (seg.dtype != torch.int32 or seg.stride(0) != 1):
        return None
    try:
        hs = tuple(int(h) for h in horizons)
        h_max = labels.max_horizon(hs, lag) - lag  # validates horizons and lag
        n = int(close.shape[0])
        r1 = torch.empty(n, dtype=torch.float64, device=close.device)
        bl = torch.empty(n, dtype=torch.float64, device=close.device)
        n_blk = math.ceil(n / _LABEL_BLOCK)
        cnt = torch.empty((n_blk, 3), dtype=torch.int32, device=close.device)
        hs_t = _const(close.device, hs, torch.int64)
        den = _const(close.device, tuple(math.sqrt(h) for h in hs), torch.float64)
        ker["fwd_labels"][(n_blk,)](
            close,
            seg if seg is not None else close,
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
            HAS_SEG=seg is not None,
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
    seg = changes[ts0:ve] if changes is not None else None
    lab = _fused_labels(close, seg, cfg.horizons, cfg.entry_lag, n_tr) if fused is not None else None
    if lab is not None:
        r1, blended, kc = lab  # the roll mask is applied in the kernel
        # [target, r1, close] counts straight from the kernel
        lab_counts = torch.stack([kc[0] if cfg.target == "blended" else kc[1], kc[1], kc[2]])
        target = blended if cfg.target == "blended" else r1
    else:
        r1, blended = _labels(close, cfg.horizons, cfg.entry_lag)
        if seg is not None:
            r1, blended = _mask_segment_crossings(seg, r1, blended, cfg)
        target = blended if cfg.target == "blended" else r1
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
    if (checks[2] or checks[3]) and seg is None:
        raise FxDataError(f"{where}: {max(checks[2], checks[3])} training labels undefined (purge/prices)")

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
        horizons=tuple(cfg.horizons),
        entry_lag=cfg.entry_lag,
        target=cfg.target,
        extra={"train_labels_undefined": int(max(checks[2], checks[3])), "fused_kernels": fused is not None},
    )


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
