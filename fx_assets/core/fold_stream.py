"""Training a fold that does not fit in device memory: its rows streamed from the fxcache files.

Owns the other path of the training stage (issue 11, "Training when a fold does not fit on the
device"): the device-memory budget decision (:func:`fold_device_bytes`, :func:`plan_fold`,
:func:`default_budget_bytes`) and :class:`StreamedRows`, the
:class:`~fx_assets.core.trainers.rows.FoldRows` whose blocks are read from the fold's fxcache
files as the trainers ask for them.

How a block travels
-------------------
The files are memory-mapped and validated by :func:`fx_assets.core.fxcache.open_fxcache` (every
checksum, once, at open). A block of rows ``[a, b)`` of the fold's concatenation is read with
``os.preadv`` (page cache or disk, outside the GIL) into one of two pinned host buffers by a
reader thread, which then queues its host→device copy on a side CUDA stream into one of two
device buffers; the compute stream waits for that copy only when it needs the block, so the
copy of block ``i + 1`` overlaps the training on block ``i``. A host buffer is refilled only
after its copy completed, a device buffer only after the compute that read it (CUDA events).
On the CPU the same code runs: buffers are not pinned and the copies are synchronous.

What a block holds
------------------
Its value rows (every column, as stored: f32 or bf16), and the f64 price rows ``[a, b + reach)``
clipped to the fold's ``val_end``, ``reach = entry_lag + max horizon``: the look-ahead its
forward labels need, so a label at a block edge is the one the resident path computes. On the
device the block's inputs are gathered, widened to f32 and normalised by
:func:`~fx_assets.core.trainers.transition.normalise_values` (on CUDA the resident path's Triton
``normalise`` kernel, elsewhere its torch ops); the labels come from
:func:`~fx_assets.core.trainers.transition.block_labels` (the resident path's ``fwd_labels``
kernel on CUDA, its torch ops elsewhere) over the block and its look-ahead, with
the roll mask from the ``contract`` price column's changes inside that window (a label never
spans a roll; prices past ``val_end`` are never read) — the resident path's functions, so equal
statistics give equal bits.

Snapshot rows (the file's ``row_unit`` meta): every form of ``core.snapshot_labels`` streams.
A block's price window is its rows plus a halo on each side: ``back - 1`` rows of look-back
(``back`` = the most rows up to ``n`` any horizon's label reads: ``h`` for ``deeplob``,
``min(smooth, h)`` for ``tlob``, 1 for ``unsmoothed`` / ``fi``) and the labels' reach
(``TrainConfig.purge_bars``) of look-ahead, both clipped to the fold's ``[train_start,
val_end)`` as the resident labels are. The labels are ``relative_change`` of the window's exact
``mid`` half-ticks with breaks at changes of its ``session`` / ``contract`` columns (a window that
spans a roll or session break is undefined wherever the block edges fall), so every label is the
resident one bit for bit. A fitted dead band (``snapshot_stationary_share``) is fitted before
training in one streaming pass over the training rows only (prices, no inputs): every horizon's
|change| values collected exactly as distinct values with counts
(:class:`~fx_assets.core.snapshot_labels.AbsChangeQuantile`), whose quantile is that of the
resident ``fit_alpha`` bit for bit; validation rows never enter it.

Normalisation statistics
------------------------
One streaming pass over the training rows only, in row order, before training: each block's
float64 ``var_mean`` combined by Chan's parallel update (:class:`Moments`), then
:func:`~fx_assets.core.trainers.transition.floor_std`: the resident definitions (population
variance, the same floor). The resident path reduces all rows at once, so the two agree to
rounding (~1e-16 relative), not bit for bit; the float32 scale and shift that reach the inputs
are then almost always identical. The same pass counts non-finite inputs and closes and
undefined training labels (the resident checks); the validation rows are checked in the same
pass.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from fx_assets.core import calendar, labels
from fx_assets.core.device_store import (
    ROW_UNIT_PRICE,
    SEGMENT_COLUMN,
    check_row_unit,
    default_device,
    file_row_unit,
)
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import FxCache, open_fxcache
from fx_assets.core.snapshot_labels import (
    AbsChangeQuantile,
    back_rows,
    breaks_of,
    classify,
    half_ticks,
    relative_change,
)
from fx_assets.core.trainers.common import FoldRangeLike, TrainConfig
from fx_assets.core.trainers.rows import FoldRows, Moments, Part, RowBlock
from fx_assets.core.trainers.transition import block_labels, floor_std, normalise_values, select_inputs

DEFAULT_STREAM_BLOCK_ROWS = 1 << 20
BUDGET_MARGIN_FRACTION = 0.10  # default budget: free device memory minus this share of it ...
BUDGET_MARGIN_MIN = 2 << 30  # ... and at least this many bytes
#: device bytes a trainer needs per fold row beyond the fold's inputs and labels (its index and
#: permutation buffers, the evaluation's outputs), a bound used by :func:`fold_device_bytes`
TRAINER_BYTES_PER_ROW = 24


def default_budget_bytes(device: torch.device) -> int:
    """The device-memory budget when none is set: the free memory of ``device`` (CUDA:
    ``mem_get_info``; CPU: :func:`available_host_bytes`) minus a margin (10 %, at least 2 GiB)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = available_host_bytes()
    return max(0, int(free - max(BUDGET_MARGIN_MIN, BUDGET_MARGIN_FRACTION * free)))


def available_host_bytes(meminfo: str = "/proc/meminfo") -> int:
    """Host memory a new allocation can have: Linux's ``MemAvailable`` (free pages plus the page
    cache and other memory the kernel can reclaim). Not ``MemFree``: after a feature build the
    page cache holds gigabytes of memory-mapped sidecars, MemFree is then near zero, and every
    fold would stream although it fits. Elsewhere, the free physical pages."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kiB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fold_device_bytes(
    n_rows: int, value_width: int, value_itemsize: int, price_width: int, n_features: int
) -> int:
    """Device bytes of a resident fold of ``n_rows`` rows (train start to validation end): the
    resident quarters (value block, f64 price block, ln close, roll counts) plus the fold's
    transition outputs (f32 inputs, three f64 label vectors) and the trainer's per-row buffers."""
    resident = n_rows * (value_width * value_itemsize + price_width * 8 + 8 + 4)
    transition = n_rows * (4 * n_features + 3 * 8)
    return int(resident + transition + n_rows * TRAINER_BYTES_PER_ROW)


def plan_fold(need_bytes: int, budget_bytes: int) -> str:
    """``'resident'`` when a fold's device bytes fit the budget, else ``'stream'``."""
    return "resident" if need_bytes <= budget_bytes else "stream"


@dataclass
class StreamStats:
    """What streaming moved and where it waited (seconds are wall time unless noted)."""

    blocks: int = 0
    rows: int = 0
    h2d_bytes: int = 0
    read_seconds: float = 0.0  # reader thread: preadv into the pinned buffers
    read_wait_seconds: float = 0.0  # the training thread waiting for the reader
    prep_seconds: float = 0.0  # the statistics pass
    # CUDA event pairs: (start, end) of each block's host→device copy on the copy stream, and of
    # the compute stream's wait for it (a GPU stall when the copy was not done yet)
    _copy_events: list[tuple[Any, Any]] = field(default_factory=list)
    _wait_events: list[tuple[Any, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The figures, the CUDA event times resolved (synchronises on them)."""

        def total(evs: list[tuple[Any, Any]]) -> float:
            return sum(float(a.elapsed_time(b)) for a, b in evs) / 1e3

        h2d_s = total(self._copy_events)
        return {
            "blocks": self.blocks,
            "rows": self.rows,
            "h2d_bytes": self.h2d_bytes,
            "h2d_seconds": h2d_s,
            "h2d_gbps": self.h2d_bytes / h2d_s / 1e9 if h2d_s > 0 else float("nan"),
            "gpu_copy_wait_seconds": total(self._wait_events),
            "read_seconds": self.read_seconds,
            "read_wait_seconds": self.read_wait_seconds,
            "prep_seconds": self.prep_seconds,
        }


@dataclass
class _File:
    path: Path
    fc: FxCache
    fd: int
    n: int
    row0: int  # first row in the fold's concatenation


class StreamedRows(FoldRows):
    """A fold's rows streamed from its fxcache files (module docstring).

    ``paths``: the fold's quarters in time order (their concatenation is what ``fold_range``
    indexes, as a resident view). ``block_rows``: rows per block (the grid of
    :meth:`FoldRows.grid`). ``stats``: (mean, std) to use instead of the streaming pass (tests
    compare the paths with it). ``verify``: re-hash every file's checksums at open.
    """

    stable = False

    def __init__(
        self,
        paths: Sequence[Path | str],
        fold_range: FoldRangeLike,
        cfg: TrainConfig,
        *,
        block_rows: int = DEFAULT_STREAM_BLOCK_ROWS,
        device: torch.device | str | None = None,
        keys: Sequence[str] | None = None,
        stats: tuple[torch.Tensor, torch.Tensor] | None = None,
        verify: bool = True,
        price_tick: float | None = None,
    ) -> None:
        if block_rows < 1:
            raise FxDataError(f"block_rows must be >= 1, got {block_rows}")
        self.cfg = cfg
        self.block_rows = self._cap = int(block_rows)
        self._device = torch.device(device) if device is not None else default_device()
        self.keys = tuple(keys) if keys is not None else tuple(Path(p).name for p in paths)
        self.horizons, self.entry_lag, self.target = tuple(cfg.horizons), cfg.entry_lag, cfg.target
        self.reach = labels.max_horizon(cfg.horizons, cfg.entry_lag)
        self.price_tick = price_tick
        self._zero_counts = [0, 0]  # snapshot rows: (defined, stationary) training labels
        self.back = 0  # rows before a block's first row its labels read (the look-back halo)
        self._lab = cfg.snapshot_labels()
        self._alpha = {h: 0.0 for h in self._lab.horizons}  # snapshot dead bands, per horizon
        if cfg.row_unit == "snapshot":
            self.horizons, self.entry_lag, self.target = (
                (cfg.train_horizon,),
                0,
                f"snapshot_h{cfg.train_horizon}",
            )
            self.reach = cfg.purge_bars  # the snapshot labels' reach in rows (covers every h)
            lab = self._lab
            self.back = max(back_rows(lab.form, h, lab.smooth) for h in lab.horizons) - 1
            if price_tick is None:
                raise FxDataError("streamed snapshot folds need the instrument tick (price_tick)")
        self.stream_stats = StreamStats()
        self._files: list[_File] = []
        self._lock = threading.Lock()
        try:
            self._open(paths, verify)
            self._check_range(fold_range)
            self._setup()
            if cfg.row_unit == "snapshot" and self._lab.stationary_share is not None:
                self._alpha = self._fit_dead_band(self._lab.stationary_share)
            if stats is None:
                self.mean, self.std = self._statistics()
            else:
                self.mean, self.std = (t.to(self._device, torch.float64) for t in stats)
        except BaseException:
            self.close()
            raise
        self.extra: dict[str, Any] = {"rows": "streamed", "train_labels_undefined": self._undefined}
        if cfg.row_unit == "snapshot":
            defined, zero = self._zero_counts
            self.extra.update(
                row_unit="snapshot",
                train_horizon=cfg.train_horizon,
                label_form=cfg.snapshot_form,
                zero_handling=cfg.snapshot_zero,
                zero_move_share=zero / defined if defined else float("nan"),
                alpha=self._alpha[cfg.train_horizon],
                horizon_alpha=dict(self._alpha),
            )

    # ------------------------------------------------------------------ setup
    def _open(self, paths: Sequence[Path | str], verify: bool) -> None:
        row0, layout = 0, None
        for p in paths:
            path = Path(p)
            fc = open_fxcache(path, verify_finite=False, verify_checksums=verify)
            h = fc.header
            lay = (tuple(fc.value_column_names), self._price_index(fc), h.row_width, h.price_width, fc.dtype)
            if layout is not None and lay != layout:
                fc.close()
                raise FxDataError(f"{path}: column layout differs from {self._files[0].path}")
            layout = lay
            self._files.append(_File(path, fc, os.open(path, os.O_RDONLY), int(h.n_bars), row0))
            row0 += int(h.n_bars)
        if layout is None:
            raise FxDataError("StreamedRows: no fxcache files")
        self._n_rows = row0
        self._columns, pidx, self._vw, self._pw, self._dtype = layout
        self._pidx = dict(pidx)
        units = {str(file_row_unit(f.fc)) for f in self._files}
        if len(units) != 1:
            raise FxDataError(f"{self._files[0].path}: the fold's files mix row units {sorted(units)}")
        self.row_unit = check_row_unit(str(self._files[0].path), units.pop(), tuple(self._pidx))
        if self.row_unit != self.cfg.row_unit:
            raise FxDataError(
                f"{self._files[0].path}: the fxcache rows are {self.row_unit!r} rows, the trainer config "
                f"expects {self.cfg.row_unit!r} rows (pipeline fxcache.row_unit and the files disagree)"
            )

    @staticmethod
    def _price_index(fc: FxCache) -> tuple[tuple[str, int], ...]:
        return tuple(
            sorted(((c.name, c.index) for c in fc.columns if c.group == "price"), key=lambda t: t[1])
        )

    def _check_range(self, fr: FoldRangeLike) -> None:
        ts0, te, vs, ve = int(fr.train_start), int(fr.train_end), int(fr.val_start), int(fr.val_end)
        where = f"fold {self.keys} [{ts0}:{te}) / [{vs}:{ve})"
        if not (0 <= ts0 < te <= vs < ve <= self._n_rows):
            raise FxDataError(f"{where}: ranges out of order or outside the {self._n_rows}-row concatenation")
        if vs - te < self.cfg.purge_bars:
            raise FxDataError(
                f"{where}: gap {vs - te} bars < label reach {self.cfg.purge_bars} (entry lag + max horizon): "
                "training labels would read validation prices"
            )
        self.bounds = (ts0, te, vs, ve)
        self._where = where

    def _setup(self) -> None:
        dev = self._device
        self.columns, idx = select_inputs(self._columns, tuple(self._pidx), self.keys, self.cfg)
        self._col_idx = torch.tensor(idx, dtype=torch.long, device=dev)
        self._close_j = self._pidx[ROW_UNIT_PRICE[self.row_unit]]  # close, or the snapshot mid
        self._seg_j = self._pidx.get(SEGMENT_COLUMN)
        self._sess_j = self._pidx.get("session") if self.row_unit == "snapshot" else None
        cuda = dev.type == "cuda"
        wire = {
            "f32": (np.float32, torch.float32),
            "bf16": (np.int16, torch.int16),
            "f64": (np.float64, torch.float64),
        }
        self._np_dtype, tdt = wire[self._dtype]
        self._bf16 = self._dtype == "bf16"
        cap = self._cap
        capp = self.back + cap + self.reach  # look-back halo, the block, the look-ahead
        self._host = [
            (
                torch.empty((cap, self._vw), dtype=tdt, pin_memory=cuda),
                torch.empty((capp, self._pw), dtype=torch.float64, pin_memory=cuda),
            )
            for _ in range(2)
        ]
        self._dev = [
            (
                torch.empty((cap, self._vw), dtype=tdt, device=dev),
                torch.empty((capp, self._pw), dtype=torch.float64, device=dev),
            )
            for _ in range(2)
        ]
        self._copy_stream = torch.cuda.Stream(device=dev) if cuda else None
        self._copied = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._consumed = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fx-stream")
        self._undefined = 0
        self._ts_cache: npt.NDArray[np.int64] | None = None

    @property
    def device(self) -> torch.device:
        return self._device

    def close(self) -> None:
        """Close the files and the reader thread (the buffers go with the object)."""
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.shutdown(wait=True)
        for f in self._files:
            try:
                os.close(f.fd)
            except OSError:
                pass
            f.fc.close()
        self._files = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ reading
    def _pieces(self, lo: int, hi: int) -> Iterator[tuple[_File, int, int, int]]:
        """(file, first local row, last local row, offset in the block) covering ``[lo, hi)``."""
        for f in self._files:
            a, b = max(lo, f.row0), min(hi, f.row0 + f.n)
            if a < b:
                yield f, a - f.row0, b - f.row0, a - lo

    def _pread(self, fd: int, dest: torch.Tensor, offset: int, path: Path) -> None:
        view = memoryview(dest.numpy()).cast("B")  # type: ignore[arg-type]
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise FxDataError(f"{path}: short read at byte {offset + done}")
            done += got

    def _fill(self, slot: int, lo: int, hi: int, with_x: bool) -> tuple[int, int, int]:
        """Reader thread: rows ``[lo, hi)`` (and the price look-back and look-ahead) into host
        buffer ``slot``, then their copy to device buffer ``slot`` queued on the copy stream.
        (rows, look-ahead, look-back); the price rows are ``[lo - look-back, hi + look-ahead)``,
        clipped to the fold's ``[train_start, val_end)`` (the resident labels read no other row)."""
        t0 = time.perf_counter()
        hv, hp = self._host[slot]
        dv, dp = self._dev[slot]
        ev = self._copied[slot]
        if ev is not None:
            ev.synchronize()  # the host buffer's previous copy has completed
        m = hi - lo
        look = min(self.reach, self.bounds[3] - hi)
        back = min(self.back, lo - self.bounds[0])
        if with_x:
            for f, a, b, off in self._pieces(lo, hi):
                h = f.fc.header
                rb = int(h.row_width) * int(h.itemsize)
                self._pread(f.fd, hv[off : off + b - a], int(h.values_offset) + a * rb, f.path)
        for f, a, b, off in self._pieces(lo - back, hi + look):
            h = f.fc.header
            self._pread(f.fd, hp[off : off + b - a], int(h.price_offset) + a * int(h.price_width) * 8, f.path)
        t1 = time.perf_counter()
        k = back + m + look  # price rows
        nbytes = (m * hv.shape[1] * hv.element_size() if with_x else 0) + k * hp.shape[1] * 8
        cs = self._copy_stream
        if cs is None:  # CPU: the same copy, synchronous
            if with_x:
                dv[:m].copy_(hv[:m])
            dp[:k].copy_(hp[:k])
        else:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self._device), torch.cuda.stream(cs):
                cs.wait_event(self._consumed[slot])  # type: ignore[arg-type]  # the device buffer's last reader is done
                e0.record(cs)
                if with_x:
                    dv[:m].copy_(hv[:m], non_blocking=True)
                dp[:k].copy_(hp[:k], non_blocking=True)
                e1.record(cs)
                ev.record(cs)  # type: ignore[union-attr]
            with self._lock:
                self.stream_stats._copy_events.append((e0, e1))
        with self._lock:
            self.stream_stats.read_seconds += t1 - t0
            self.stream_stats.h2d_bytes += nbytes
        return m, look, back

    def _raw_blocks(
        self, row_spans: Sequence[tuple[int, int]], with_x: bool, normalised: bool = False
    ) -> Iterator[tuple[int, int, int, torch.Tensor | None, torch.Tensor]]:
        """(lo, hi, look-back, inputs or None, price window) per span of concatenation rows,
        double-buffered through the reader thread. The window holds the close (or mid) and
        contract (and session) columns of rows ``[lo - look-back, hi + look-ahead)``. The inputs are the raw f32 input
        columns, or (``normalised``) the model inputs by ``normalise_values``, computed from the
        device buffer before it is released."""
        if not row_spans:
            return
        cuda = self._copy_stream is not None
        main = torch.cuda.current_stream(self._device) if cuda else None
        fut: Future[tuple[int, int, int]] = self._reader.submit(self._fill, 0, *row_spans[0], with_x)
        for i, (lo, hi) in enumerate(row_spans):
            slot = i % 2
            t0 = time.perf_counter()
            m, look, back = fut.result()
            self.stream_stats.read_wait_seconds += time.perf_counter() - t0
            if i + 1 < len(row_spans):
                fut = self._reader.submit(self._fill, (i + 1) % 2, *row_spans[i + 1], with_x)
            dv, dp = self._dev[slot]
            if main is not None:
                w0, w1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                w0.record(main)
                main.wait_event(self._copied[slot])  # type: ignore[arg-type]
                w1.record(main)
                self.stream_stats._wait_events.append((w0, w1))
            raw = None
            if with_x:
                vals = dv[:m].view(torch.bfloat16) if self._bf16 else dv[:m]
                if normalised:
                    raw = normalise_values(vals, self._col_idx, self.mean, self.std, self.cfg)
                else:
                    g = vals.index_select(1, self._col_idx)
                    raw = g if g.dtype == torch.float32 else g.to(torch.float32)
            px = dp[: back + m + look]
            cols = [self._close_j] + [j for j in (self._seg_j, self._sess_j) if j is not None]
            win = px[:, cols].clone()  # off the device buffer before it is released
            if main is not None:
                self._consumed[slot].record(main)  # type: ignore[union-attr]
            self.stream_stats.blocks += 1
            self.stream_stats.rows += m
            yield lo, hi, back, raw, win
        # the last block's reads are done (the next call's first fill reuses buffer 0)

    def _labels(
        self, win: torch.Tensor, m: int, back: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(target, r1, close) of the block's ``m`` rows from its price window (``back`` rows of
        look-back first; bar rows read none): close + contract for bar rows, mid, contract and
        session for snapshot rows."""
        if self.row_unit == "snapshot":
            return self._snapshot_labels(win, m, back)
        if back:
            raise FxDataError(f"{self._where}: bar labels read no look-back rows (got {back})")
        close = win[:, 0]
        changes = None
        if win.shape[1] > 1:
            seg = win[:, 1]
            changes = torch.zeros(seg.shape[0], dtype=torch.int32, device=seg.device)
            if seg.shape[0] > 1:
                changes[1:] = torch.cumsum(seg[1:] != seg[:-1], 0, dtype=torch.int32)
        r1, blended = block_labels(close, changes, self.cfg)
        target = blended if self.cfg.target == "blended" else r1
        return target[:m], r1[:m], close[:m]

    def _window_changes(
        self, win: torch.Tensor, m: int, back: int, horizons: Sequence[int]
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
        """({h: label change of the block's ``m`` rows}, r1, mid) from a snapshot price window
        whose first ``back`` rows are look-back: ``relative_change`` of the window's exact
        half-ticks with breaks at its session / contract changes. The window holds every row the
        resident labels of these rows read (the look-back and look-ahead, clipped to the fold),
        so each value is the resident one bit for bit."""
        assert self.price_tick is not None
        mid = win[:, 0].contiguous()
        if win.shape[1] > 1:
            br = breaks_of(*[win[:, j].contiguous() for j in range(1, win.shape[1])])
        else:
            br = torch.zeros(mid.shape[0], dtype=torch.int64, device=mid.device)
        u = half_ticks(mid, self.price_tick)
        lab = self._lab
        rows = slice(back, back + m)
        ch = {h: relative_change(u, br, h, lab.form, lab.smooth)[rows] for h in horizons}
        r1 = relative_change(u, br, 1, "unsmoothed", 1)[rows]
        return ch, r1, mid[rows]

    def _snapshot_labels(
        self, win: torch.Tensor, m: int, back: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The resident path's snapshot labels of the block's ``m`` rows (classes of the training
        horizon with the fold's fitted dead band)."""
        h = self.cfg.train_horizon
        ch, r1, mid = self._window_changes(win, m, back, (h,))
        self._last_change = ch[h]
        return classify(ch[h], self._alpha[h], self._lab.zero), r1, mid

    def _fit_dead_band(self, share: float) -> dict[int, float]:
        """Each horizon's dead band, fitted in one streaming pass over the training rows only
        (prices, no inputs): the ``share`` quantile of |change| by
        :class:`~fx_assets.core.snapshot_labels.AbsChangeQuantile`, exactly the resident
        :func:`~fx_assets.core.snapshot_labels.fit_alpha`."""
        t0 = time.perf_counter()
        ts0, te = self.bounds[0], self.bounds[1]
        fits = {h: AbsChangeQuantile(share) for h in self._lab.horizons}
        spans = [(ts0 + a, ts0 + b) for a, b in self.grid("train", 0, te - ts0)]
        for lo, hi, back, _, win in self._raw_blocks(spans, False):
            ch, _, _ = self._window_changes(win, hi - lo, back, self._lab.horizons)
            for h, c in ch.items():
                fits[h].add(c)
        self.stream_stats.prep_seconds += time.perf_counter() - t0
        return {h: f.alpha() for h, f in fits.items()}

    def val_classes(self) -> dict[int, torch.Tensor]:
        """Snapshot rows: the label class of every configured horizon per validation row (one
        more pass over the validation blocks, with their look-back and look-ahead), for
        evaluation; each horizon's dead band is the one fitted on the training rows."""
        if self.row_unit != "snapshot":
            raise FxDataError(f"{self._where}: val_classes is for snapshot rows")
        vs = self.bounds[2]
        spans = [(vs + a, vs + b) for a, b in self.grid("val", 0, self.n_val)]
        hs = self._lab.horizons
        out: dict[int, list[torch.Tensor]] = {h: [] for h in hs}
        for lo, hi, back, _, win in self._raw_blocks(spans, False):
            ch, _, _ = self._window_changes(win, hi - lo, back, hs)
            for h in hs:
                out[h].append(classify(ch[h], self._alpha[h], self._lab.zero))
        return {h: torch.cat(v) for h, v in out.items()}

    def _offset(self, part: Part) -> int:
        return self.bounds[0] if part == "train" else self.bounds[2]

    def _read(self, part: Part, spans: Sequence[tuple[int, int]], with_x: bool) -> Iterator[RowBlock]:
        off = self._offset(part)
        ts = self._ts()
        row_spans = [(off + a, off + b) for a, b in spans]
        for lo, hi, back, x, win in self._raw_blocks(row_spans, with_x, normalised=True):
            y, r1, _ = self._labels(win, hi - lo, back)
            sess = calendar.session_day(ts[lo:hi]).astype(np.int32)
            yield RowBlock(part, lo - off, x, y, r1, sess)

    def _ts(self) -> npt.NDArray[np.int64]:
        if self._ts_cache is None:
            self._ts_cache = np.concatenate([np.asarray(f.fc.ts) for f in self._files])
        return self._ts_cache

    def val_ts(self) -> npt.NDArray[np.int64]:
        return np.array(self._ts()[self.bounds[2] : self.bounds[3]], dtype=np.int64)

    # ------------------------------------------------------------------ statistics
    def _statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass in row order: training-row moments and the resident path's checks."""
        t0 = time.perf_counter()
        ts0, te, vs, ve = self.bounds
        mom = Moments()
        dev = self._device
        bad = torch.zeros(4, dtype=torch.int64, device=dev)  # -, -, undefined blended, undefined r1
        spans = [(ts0 + a, ts0 + b) for a, b in self.grid("train", 0, te - ts0)]
        spans += [(vs + a, vs + b) for a, b in self.grid("val", 0, ve - vs)]
        first_bad: tuple[int, int] | None = None
        for lo, hi, back, raw, win in self._raw_blocks(spans, True):
            assert raw is not None
            train = hi <= te
            if train:
                mom.add(raw)
            y, r1, close = self._labels(win, hi - lo, back)
            bad_in = ~torch.isfinite(raw)
            bad_close = ~(torch.isfinite(close) & (close > 0))
            if train:
                bad[2] += (~torch.isfinite(y)).sum()
                bad[3] += (~torch.isfinite(r1)).sum()
                if self.row_unit == "snapshot":
                    ch = self._last_change  # stationary: inside the dead band (resident shares)
                    a = self._alpha[self.cfg.train_horizon]
                    self._zero_counts[0] += int(torch.isfinite(ch).sum())
                    self._zero_counts[1] += int(((ch <= a) & (ch >= -a)).sum())
            n_in, n_close = torch.stack([bad_in.sum(), bad_close.sum()]).tolist()  # one sync a block
            if n_close:  # closes first, as the resident path reports them
                j = int(torch.nonzero(bad_close)[0, 0])
                raise FxDataError(
                    f"{self._where}: close must be finite and > 0; slice row {lo + j} has {float(close[j])!r}"
                )
            if n_in and first_bad is None:
                r, c = torch.nonzero(bad_in)[0].tolist()
                first_bad = (lo + r, c)
        n_bl, n_r1 = bad[2:].tolist()
        if first_bad is not None:
            r, c = first_bad
            raise FxDataError(f"{self._where}: column {self.columns[c]!r} is NaN/Inf at slice row {r}")
        undefined = n_bl if self.cfg.target == "blended" else n_r1
        if (undefined or n_r1) and self._seg_j is None and self.row_unit == "bar":
            raise FxDataError(
                f"{self._where}: {max(undefined, n_r1)} training labels undefined (purge/prices)"
            )
        self._undefined = int(max(undefined, n_r1))
        if self.row_unit == "snapshot":  # as the resident extra: undefined changes, not excluded classes
            self._undefined = (te - ts0) - self._zero_counts[0]
        if mom.n != te - ts0:
            raise FxDataError(f"{self._where}: statistics pass saw {mom.n} of {te - ts0} training rows")
        mean = mom.mean
        assert mean is not None
        var = mom.var(correction=0)  # population variance, as the resident var_mean
        self.stream_stats.prep_seconds += time.perf_counter() - t0
        return mean, floor_std(var, self.cfg)
