"""The snapshot fold's labels in one CUDA kernel (Triton): every horizon's change and class,
the 1-row reward, and the class counts of the training rows, in one pass over the fold.

The torch definition (``core.snapshot_labels``) is the reference: this kernel computes the same
float64 values with the same operations in the same order (int64 half-tick differences, one
conversion, one IEEE division), so its outputs are bitwise equal to it (GPU test). It covers
the fold transition's common case, a dead band of 0 (``stationary_share`` None): a fitted band
needs the quantile of the changes first, and takes the torch path. Without Triton, on the CPU,
or if the kernel fails to build, :func:`fused_snapshot_labels` returns None and the torch path
runs; ``FX_FUSED_FOLD=0`` switches it off like the bar kernels.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from typing import TYPE_CHECKING, Any

from fx_assets.core.snapshot_labels import HorizonLabels, SnapshotLabelConfig, back_rows, class_shares

if TYPE_CHECKING:
    import torch

_FORMS = {"unsmoothed": 0, "fi": 1, "deeplob": 2, "tlob": 3}
_STATE: dict[str, Any] = {"enabled": os.environ.get("FX_FUSED_FOLD", "1") != "0", "error": ""}
_KERNEL: dict[str, Any] = {}
_CONSTS: dict[tuple[str, tuple[int, ...]], Any] = {}
BLOCK = 1024  # rows per program


def _kernel() -> Any | None:
    if not _STATE["enabled"]:
        return None
    if _KERNEL:
        return _KERNEL["snap_labels"]
    try:
        triton = importlib.import_module("triton")
        tl = importlib.import_module("triton.language")
    except ImportError as exc:
        _STATE.update(enabled=False, error=f"no triton: {exc}")
        return None

    @triton.jit(do_not_specialize=["n", "n_tr"])
    def snap_labels(
        u_ptr,  # int64 half-ticks [n]
        s_ptr,  # int64 prefix sums of u [n + 1] (smoothed forms; else u_ptr, unused)
        br_ptr,  # int64 running break counts [n] (HAS_BR; else u_ptr, unused)
        hs_ptr,  # int64 horizons [N_H]
        back_ptr,  # int64 rows each horizon's label reads up to n [N_H]
        ch_ptr,  # float64 changes [N_H, n]
        cls_ptr,  # float64 classes [N_H, n]
        r1_ptr,  # float64 1-row relative change [n]
        cnt_ptr,  # int32 [N_H, 4]: defined, up, down, stationary training rows
        n,
        n_tr,
        N_H: tl.constexpr,  # type: ignore[name-defined]
        FORM: tl.constexpr,  # type: ignore[name-defined]
        HAS_BR: tl.constexpr,  # type: ignore[name-defined]
        EXCLUDE: tl.constexpr,  # type: ignore[name-defined]
        BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):
        pid = tl.program_id(0)
        j = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = j < n
        nan = float("nan")
        u0 = tl.load(u_ptr + j, mask=inb, other=1)
        now = u0.to(tl.float64)
        if HAS_BR:
            b0 = tl.load(br_ptr + j, mask=inb, other=0)
        # the reward of a position held one update: unsmoothed, horizon 1
        ok1 = inb & (j + 1 < n)
        r1 = (tl.load(u_ptr + j + 1, mask=ok1, other=1).to(tl.float64) - now) / now
        if HAS_BR:
            ok1 = ok1 & (tl.load(br_ptr + j + 1, mask=ok1, other=0) == b0)
        tl.store(r1_ptr + j, tl.where(ok1, r1, nan), mask=inb)
        tr = inb & (j < n_tr)
        n64 = tl.full([BLOCK], 0, tl.int64) + n  # row stride of the outputs, in int64
        for i in tl.static_range(N_H):
            h = tl.load(hs_ptr + i)
            back = tl.load(back_ptr + i)
            ok = inb & (j >= back - 1) & (j + h < n)
            if FORM == 0:  # (p[n+h] - p[n]) / p[n]
                val = (tl.load(u_ptr + j + h, mask=ok, other=1).to(tl.float64) - now) / now
            elif FORM == 1:  # (mean p[n+1..n+h] - p[n]) / p[n]
                fut = tl.load(s_ptr + j + h + 1, mask=ok, other=0) - tl.load(s_ptr + j + 1, mask=ok, other=0)
                val = (fut.to(tl.float64) / h.to(tl.float64) - now) / now
            else:  # deeplob (w = h) and tlob (w = back): (m(n+h) - m(n)) / m(n), m = mean of w
                w = back
                past = (
                    tl.load(s_ptr + j + 1, mask=ok, other=1) - tl.load(s_ptr + j + 1 - w, mask=ok, other=0)
                ).to(tl.float64) / w.to(tl.float64)
                fut = (
                    tl.load(s_ptr + j + h + 1, mask=ok, other=0)
                    - tl.load(s_ptr + j + h + 1 - w, mask=ok, other=0)
                ).to(tl.float64) / w.to(tl.float64)
                val = (fut - past) / past
            if HAS_BR:
                ok = ok & (
                    tl.load(br_ptr + j + h, mask=ok, other=0)
                    == tl.load(br_ptr + j + 1 - back, mask=ok, other=0)
                )
            ch = tl.where(ok, val, nan)
            cls = (ch > 0.0).to(tl.float64) - (ch < 0.0).to(tl.float64)
            cls = tl.where(ok, cls, nan)
            t_ok = tr & ok
            n_def = tl.sum(t_ok.to(tl.int32), axis=0)
            n_up = tl.sum((t_ok & (cls == 1.0)).to(tl.int32), axis=0)
            n_dn = tl.sum((t_ok & (cls == -1.0)).to(tl.int32), axis=0)
            n_fl = tl.sum((t_ok & (cls == 0.0)).to(tl.int32), axis=0)
            tl.atomic_add(cnt_ptr + i * 4 + 0, n_def, mask=n_def > 0)
            tl.atomic_add(cnt_ptr + i * 4 + 1, n_up, mask=n_up > 0)
            tl.atomic_add(cnt_ptr + i * 4 + 2, n_dn, mask=n_dn > 0)
            tl.atomic_add(cnt_ptr + i * 4 + 3, n_fl, mask=n_fl > 0)
            if EXCLUDE:
                cls = tl.where(cls == 0.0, nan, cls)
            tl.store(ch_ptr + i * n64 + j, ch, mask=inb)
            tl.store(cls_ptr + i * n64 + j, cls, mask=inb)

    _KERNEL["snap_labels"] = snap_labels
    return snap_labels


def _const(dev: torch.device, values: list[int]) -> torch.Tensor:
    """A small int64 vector on ``dev``, uploaded once per process (not once per fold)."""
    import torch

    key = (str(dev), tuple(values))
    if key not in _CONSTS:
        _CONSTS[key] = torch.tensor(values, dtype=torch.int64, device=dev)
    return _CONSTS[key]


def fused_snapshot_labels(
    u: torch.Tensor, breaks: torch.Tensor | None, n_train: int, cfg: SnapshotLabelConfig
) -> tuple[list[HorizonLabels], torch.Tensor] | None:
    """(one :class:`HorizonLabels` per horizon, the 1-row reward) of a fold's int64 half-tick
    mid ``u`` and running ``breaks``, as :func:`core.snapshot_labels.labels_of_ticks` and
    ``relative_change(u, breaks, 1, "unsmoothed", 1)`` compute them; None where this kernel
    does not apply (not CUDA, a fitted dead band, no Triton, a failed build)."""
    import torch

    if u.device.type != "cuda" or cfg.stationary_share is not None or u.dtype != torch.int64:
        return None
    if breaks is not None and (breaks.dtype != torch.int64 or breaks.shape != u.shape):
        return None
    ker = _kernel()
    if ker is None:
        return None
    try:
        n = int(u.shape[0])
        if not 0 < n_train <= n:
            return None
        dev = u.device
        u = u.contiguous()
        br = breaks.contiguous() if breaks is not None else None
        hs = [int(h) for h in cfg.horizons]
        backs = [back_rows(cfg.form, h, cfg.smooth) for h in hs]
        form = _FORMS[cfg.form]
        s = u
        if form != 0:
            s = torch.zeros(n + 1, dtype=torch.int64, device=dev)
            s[1:] = torch.cumsum(u, 0)
        hs_t = _const(dev, hs)
        back_t = _const(dev, backs)
        ch = torch.empty((len(hs), n), dtype=torch.float64, device=dev)
        cls = torch.empty((len(hs), n), dtype=torch.float64, device=dev)
        r1 = torch.empty(n, dtype=torch.float64, device=dev)
        cnt = torch.zeros((len(hs), 4), dtype=torch.int32, device=dev)
        ker[(math.ceil(n / BLOCK),)](
            u, s, br if br is not None else u, hs_t, back_t, ch, cls, r1, cnt, n, n_train,
            N_H=len(hs), FORM=form, HAS_BR=br is not None, EXCLUDE=cfg.zero == "exclude",
            BLOCK=BLOCK, num_warps=4,
        )  # fmt: skip
        table = cnt.tolist()  # the one host sync of the shares
    except Exception as exc:
        _STATE.update(enabled=False, error=f"{type(exc).__name__}: {exc}")
        _KERNEL.clear()
        warnings.warn(f"snapshot labels: fused kernel disabled ({exc}); using torch ops", stacklevel=2)
        return None
    out = []
    for i, (h, (defined, up, down, flat)) in enumerate(zip(hs, table, strict=True)):
        shares = class_shares(defined, up, down, flat, n_train, cfg.zero)
        out.append(HorizonLabels(h, ch[i], cls[i], 0.0, shares, int(defined)))
    return out, r1


def fused_state() -> dict[str, Any]:
    """Whether the kernel is on, and why not (for benchmark and run metadata)."""
    return dict(_STATE)
