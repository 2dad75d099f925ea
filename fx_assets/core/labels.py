"""Training-time labels: forward log returns, sign labels and the multi-horizon blended target.

Owns the label definitions of reference/microstructure.md §6. Labels look ahead, so they are
never stored in the fxcache: the trainer derives them from the fold's concatenated close
column, and the fold ranges purge ``max_horizon()`` bars before validation (folds.py).

Conventions (d = ``entry_lag``, default 1 for next-bar fills):

- ``forward_log_return``: ``y_j = ln C[j+d+h] - ln C[j+d]``; NaN for the last d+h bars.
- ``blended_target``: ``Y_j = mean_h( y^{(h)}_j / sqrt(h) )`` with equal weights (the
  predecessor's SP19 blend over h = 1, 5, 30); NaN, with ``valid`` False, wherever any horizon
  runs past the end of the slice. Weights are never renormalised over the horizons present.
- So the label of bar j depends only on ``close[j+d .. j+d+max(H)]``.

Every function has a numpy form and a torch form (``*_torch``), vectorised, on any device;
the two agree to float64 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from fx_assets.core import detmath
from fx_assets.core.errors import FxDataError

if TYPE_CHECKING:  # the *_torch forms import torch when called (the numpy forms need none)
    import torch

DEFAULT_HORIZONS: tuple[int, ...] = (1, 5, 30)
DEFAULT_ENTRY_LAG = 1

F64 = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]


def _check_horizons(horizons: Sequence[int], entry_lag: int) -> tuple[int, ...]:
    hs = tuple(int(h) for h in horizons)
    if not hs or any(h < 1 for h in hs) or len(set(hs)) != len(hs):
        raise ValueError(f"horizons must be distinct positive bar counts, got {tuple(horizons)}")
    if entry_lag not in (0, 1):
        raise ValueError(f"entry_lag must be 0 or 1, got {entry_lag}")
    return hs


def max_horizon(horizons: Sequence[int] = DEFAULT_HORIZONS, entry_lag: int = DEFAULT_ENTRY_LAG) -> int:
    """Bars a label reaches ahead: ``entry_lag + max(horizons)``.

    This is both the length of the NaN tail of ``blended_target`` and the minimum purge
    between a training slice and the validation block.
    """
    return entry_lag + max(_check_horizons(horizons, entry_lag))


def _log_close(close: npt.ArrayLike, name: str) -> F64:
    c = np.asarray(close, dtype=np.float64)
    if c.ndim != 1:
        raise FxDataError(f"{name}: close must be one-dimensional, got shape {c.shape}")
    bad = ~(np.isfinite(c) & (c > 0))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise FxDataError(f"{name}: close must be finite and > 0; bar {j} has {c[j]!r}")
    return detmath.log(c)  # not np.log: its bits depend on the CPU (core.detmath)


def _fwd_from_log(logc: F64, h: int, d: int) -> F64:
    n = logc.shape[0]
    out = np.full(n, np.nan)
    m = n - d - h
    if m > 0:
        out[:m] = logc[d + h :] - logc[d : d + m]
    return out


def forward_log_return(close: npt.ArrayLike, h: int, entry_lag: int = DEFAULT_ENTRY_LAG) -> F64:
    """``ln C[j+d+h] - ln C[j+d]`` per bar; NaN where ``j+d+h`` is past the end."""
    hs = _check_horizons((h,), entry_lag)
    return _fwd_from_log(_log_close(close, "forward_log_return"), hs[0], entry_lag)


def sign_label(y: npt.ArrayLike, theta: float | npt.ArrayLike = 0.0) -> F64:
    """+1 if ``y > theta``, -1 if ``y < -theta``, else 0; NaN where ``y`` is NaN.

    ``theta`` may be a scalar or per-bar (e.g. ``k*sigma_j*sqrt(h)`` with a causal sigma). For
    the binary case (theta = 0) drop the zeros yourself.
    """
    yy = np.asarray(y, dtype=np.float64)
    th = np.asarray(theta, dtype=np.float64)
    out = np.where(yy > th, 1.0, np.where(yy < -th, -1.0, 0.0))
    return np.where(np.isnan(yy), np.nan, out)


def blended_target(
    close: npt.ArrayLike,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    entry_lag: int = DEFAULT_ENTRY_LAG,
) -> tuple[F64, BoolArr]:
    """Equal-weight mean over h of ``y^{(h)} / sqrt(h)``, and its validity mask.

    The last ``max_horizon(horizons, entry_lag)`` bars are NaN / invalid (their longest
    horizon runs past the slice); no renormalisation over the shorter horizons.
    """
    hs = _check_horizons(horizons, entry_lag)
    logc = _log_close(close, "blended_target")
    acc = np.zeros(logc.shape[0])
    for h in hs:  # a loop over horizons, vectorised over bars
        acc += _fwd_from_log(logc, h, entry_lag) / math.sqrt(h)
    target = acc / len(hs)
    valid = np.isfinite(target)
    return target, valid


# --- torch ----------------------------------------------------------------------------------


def _log_close_torch(close: torch.Tensor, name: str) -> torch.Tensor:
    import torch

    if close.ndim != 1:
        raise FxDataError(f"{name}: close must be one-dimensional, got shape {tuple(close.shape)}")
    if not torch.is_floating_point(close):
        close = close.to(torch.float64)
    bad = ~(torch.isfinite(close) & (close > 0))
    if bool(bad.any()):
        j = int(torch.nonzero(bad)[0, 0])
        raise FxDataError(f"{name}: close must be finite and > 0; bar {j} has {float(close[j])!r}")
    return torch.log(close)


def _fwd_from_log_torch(logc: torch.Tensor, h: int, d: int) -> torch.Tensor:
    import torch

    n = logc.shape[0]
    out = torch.full_like(logc, float("nan"))
    m = n - d - h
    if m > 0:
        out[:m] = logc[d + h :] - logc[d : d + m]
    return out


def forward_log_return_torch(close: torch.Tensor, h: int, entry_lag: int = DEFAULT_ENTRY_LAG) -> torch.Tensor:
    """Torch form of ``forward_log_return`` (same device and float dtype as ``close``)."""
    hs = _check_horizons((h,), entry_lag)
    return _fwd_from_log_torch(_log_close_torch(close, "forward_log_return_torch"), hs[0], entry_lag)


def sign_label_torch(y: torch.Tensor, theta: float | torch.Tensor = 0.0) -> torch.Tensor:
    """Torch form of ``sign_label``."""
    import torch

    th = torch.as_tensor(theta, dtype=y.dtype, device=y.device)
    one = torch.ones((), dtype=y.dtype, device=y.device)
    zero = torch.zeros((), dtype=y.dtype, device=y.device)
    out = torch.where(y > th, one, torch.where(y < -th, -one, zero))
    return torch.where(torch.isnan(y), torch.full_like(y, float("nan")), out)


def blended_target_torch(
    close: torch.Tensor,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    entry_lag: int = DEFAULT_ENTRY_LAG,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch form of ``blended_target``: (target, valid) on ``close``'s device."""
    import torch

    hs = _check_horizons(horizons, entry_lag)
    logc = _log_close_torch(close, "blended_target_torch")
    acc = torch.zeros_like(logc)
    for h in hs:
        acc = acc + _fwd_from_log_torch(logc, h, entry_lag) / math.sqrt(h)
    target = acc / len(hs)
    return target, torch.isfinite(target)
