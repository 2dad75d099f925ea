"""Fold rows as blocks: the one interface both trainers read, resident or streamed.

Owns :class:`FoldRows` (a fold's normalised inputs and labels, handed out as :class:`RowBlock`
s of at most ``block_rows`` rows on a fixed grid of each part) and its resident implementation
:class:`ResidentRows` (views of a :class:`~fx_assets.core.trainers.common.FoldData`). The
streamed implementation, for a fold whose rows do not fit in device memory, is
:class:`fx_assets.core.fold_stream.StreamedRows`. A trainer asks for the blocks of a row range
of a part (``train`` or ``val``) in an order (:func:`block_order`, seeded per epoch); with the
same ``block_rows`` both implementations cut the same blocks, so a trainer sees the same rows in
the same order whichever path fed them.

With ``block_rows=None`` a resident fold hands out each requested range as one block (a view):
the trainers then do exactly what they did before blocks existed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from fx_assets.core.errors import FxDataError
from fx_assets.core.trainers.common import FoldData

Part = Literal["train", "val"]


@dataclass(frozen=True)
class RowBlock:
    """Rows ``[start, start + n)`` of one part of a fold, on the device (``x`` may be None when
    only labels were asked for)."""

    part: Part
    start: int
    x: torch.Tensor | None  # [n, f] float32, normalised and clipped
    y: torch.Tensor  # [n] float64 training target (NaN where undefined)
    r1: torch.Tensor  # [n] float64 1-bar forward return
    sessions: npt.NDArray[np.int32]  # [n] host

    @property
    def n(self) -> int:
        return int(self.y.shape[0])


def block_order(n_blocks: int, seed: int, epoch: int) -> list[int]:
    """The order a training epoch visits ``n_blocks`` blocks: a permutation seeded by ``(seed,
    epoch)`` (numpy, so the torch generators of the trainers are not consumed)."""
    if n_blocks <= 1:
        return list(range(n_blocks))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0x5EED])
    return [int(i) for i in rng.permutation(n_blocks)]


class FoldRows(ABC):
    """A fold's rows for the trainers (see module docstring). Subclasses set the attributes and
    implement :meth:`_read`."""

    keys: tuple[str, ...]
    bounds: tuple[int, int, int, int]  # train_start, train_end, val_start, val_end (slice rows)
    columns: tuple[str, ...]
    mean: torch.Tensor  # [f] float64, training rows only
    std: torch.Tensor  # [f] float64, floored
    horizons: tuple[int, ...]
    entry_lag: int
    target: str
    block_rows: int | None
    extra: dict[str, Any]
    #: whether each block is a view of tensors that live as long as the fold (a trainer may then
    #: use a single block in place instead of copying it into its own buffer)
    stable: bool = False

    @property
    def device(self) -> torch.device:
        return self.mean.device

    @property
    def n_features(self) -> int:
        return len(self.columns)

    @property
    def n_train(self) -> int:
        return self.bounds[1] - self.bounds[0]

    @property
    def n_val(self) -> int:
        return self.bounds[3] - self.bounds[2]

    def part_rows(self, part: Part) -> int:
        return self.n_train if part == "train" else self.n_val

    def grid(self, part: Part, lo: int, hi: int) -> list[tuple[int, int]]:
        """The blocks covering rows ``[lo, hi)`` of ``part``: the fixed grid of ``block_rows``
        from row 0 of the part, clipped to the range (one span when ``block_rows`` is None)."""
        n = self.part_rows(part)
        if not 0 <= lo <= hi <= n:
            raise FxDataError(f"fold {self.keys}: rows [{lo}, {hi}) outside the {n} {part} rows")
        if lo == hi:
            return []
        b = self.block_rows
        if b is None:
            return [(lo, hi)]
        first, last = lo // b, (hi - 1) // b
        return [(max(lo, k * b), min(hi, (k + 1) * b)) for k in range(first, last + 1)]

    def blocks(
        self,
        part: Part,
        spans: Sequence[tuple[int, int]],
        order: Sequence[int] | None = None,
        *,
        with_x: bool = True,
    ) -> Iterator[RowBlock]:
        """The blocks of ``spans`` (from :meth:`grid`) in ``order`` (default: as given)."""
        seq = [spans[i] for i in order] if order is not None else list(spans)
        return self._read(part, seq, with_x)

    def block_list(self, part: Part, lo: int, hi: int) -> Iterator[RowBlock]:
        """Blocks of ``[lo, hi)`` of ``part`` in row order."""
        return self.blocks(part, self.grid(part, lo, hi))

    @abstractmethod
    def _read(self, part: Part, spans: Sequence[tuple[int, int]], with_x: bool) -> Iterator[RowBlock]: ...

    @abstractmethod
    def val_ts(self) -> npt.NDArray[np.int64]:
        """Timestamps of the validation rows (host)."""

    def host_labels(self, part: Part, lo: int, hi: int) -> dict[str, np.ndarray]:
        """``y``, ``r1`` and ``sessions`` of rows ``[lo, hi)`` of ``part`` on the host."""
        ys, rs, ss = [], [], []
        for b in self.blocks(part, self.grid(part, lo, hi), with_x=False):
            ys.append(b.y.cpu().numpy())
            rs.append(b.r1.cpu().numpy())
            ss.append(b.sessions)
        if not ys:
            return {"y": np.empty(0), "r1": np.empty(0), "sessions": np.empty(0, np.int32)}
        return {"y": np.concatenate(ys), "r1": np.concatenate(rs), "sessions": np.concatenate(ss)}

    def norm_stats(self) -> dict[str, Any]:
        """JSON-ready per-fold normalisation statistics (as :meth:`FoldData.norm_stats`)."""
        return {
            "columns": list(self.columns),
            "mean": [float(v) for v in self.mean.cpu().tolist()],
            "std": [float(v) for v in self.std.cpu().tolist()],
            "n_train_rows": self.n_train,
            "train_rows": [self.bounds[0], self.bounds[1]],
        }


class ResidentRows(FoldRows):
    """The blocks of a resident :class:`FoldData`: views, no copies."""

    stable = True

    def __init__(self, fold: FoldData, block_rows: int | None = None) -> None:
        if block_rows is not None and block_rows < 1:
            raise FxDataError(f"block_rows must be >= 1, got {block_rows}")
        self.fold = fold
        self.keys, self.bounds, self.columns = fold.keys, fold.bounds, fold.columns
        self.mean, self.std = fold.mean, fold.std
        self.horizons, self.entry_lag, self.target = fold.horizons, fold.entry_lag, fold.target
        self.block_rows = block_rows
        self.extra = {**fold.extra, "rows": "resident"}

    def _read(self, part: Part, spans: Sequence[tuple[int, int]], with_x: bool) -> Iterator[RowBlock]:
        f = self.fold
        x, y, r1, s = (
            (f.x_train, f.y_train, f.r1_train, f.train_sessions)
            if part == "train"
            else (f.x_val, f.y_val, f.r1_val, f.val_sessions)
        )
        for a, b in spans:
            yield RowBlock(part, a, x[a:b] if with_x else None, y[a:b], r1[a:b], s[a:b])

    def val_ts(self) -> npt.NDArray[np.int64]:
        return self.fold.val_ts


def as_rows(fold: FoldData | FoldRows, block_rows: int | None = None) -> FoldRows:
    """A trainer's input as :class:`FoldRows` (a :class:`FoldData` is wrapped, resident)."""
    return fold if isinstance(fold, FoldRows) else ResidentRows(fold, block_rows)


class Moments:
    """Count, mean and sum of squared deviations of columns, combined block by block (Chan,
    Golub & LeVeque's parallel update, float64): the streaming form of ``var_mean``."""

    def __init__(self) -> None:
        self.n = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    def add(self, block: torch.Tensor) -> None:
        """Add the rows of ``block`` ([m] or [m, f], any float dtype; widened to float64)."""
        m = int(block.shape[0])
        if m == 0:
            return
        var_b, mean_b = torch.var_mean(block.to(torch.float64), dim=0, correction=0)
        m2_b = var_b * m
        if self.mean is None or self.m2 is None:
            self.n, self.mean, self.m2 = m, mean_b, m2_b
            return
        n = self.n + m
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (m / n)
        self.m2 = self.m2 + m2_b + delta * delta * (self.n * m / n)
        self.n = n

    def var(self, correction: int = 0) -> torch.Tensor:
        if self.m2 is None:
            raise FxDataError("Moments: no rows")
        return self.m2 / (self.n - correction)
