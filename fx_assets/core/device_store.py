"""Device-resident store of fxcache quarters: upload each quarter once, slice per fold by index.

Owns the host→device path of the training stage (DESIGN §6): every quarter's two fxcache
blocks (the f64 price block and the value block) are uploaded exactly once per store (one run),
one copy per block, staged through a small pinned host buffer in chunks so host memory stays
bounded whatever the quarter size, and kept on the device for the whole run. Folds never copy
from the host again: :meth:`DeviceStore.concat_view` hands back a :class:`DeviceSlice` — the
time-ordered concatenation of the named quarters — and fold code slices it by index. Files
uploaded in one :meth:`DeviceStore.add_fxcaches` call land back to back in one allocation per
block (an *arena*; the loader passes each symbol's quarters in time order), so the view of
consecutive quarters is a slice of it: no copy on the device or the host, whatever the fold.
Other key sets are built once by a device→device ``torch.cat``.

Layout on the device, per quarter
---------------------------------
- ``values``: ``[n, w]`` in the store's value dtype (float32 by default, or bfloat16), every
  column of the fxcache value block (features, OFI, padding) in file order. A uint16 source is taken as bfloat16 bit patterns
  (the fxcache ``bf16`` value dtype) and moved as 2-byte words, so a bf16 cache crosses the bus
  at half the f32 size.
- ``prices``: ``[n, k]`` float64, the *price columns* (from an fxcache file: its f64 price
  block, uploaded as it is with its padding, of which this is a view). The row unit is read
  from the file's meta (``row_unit``: ``bar``, the default of files that predate it, or
  ``snapshot``) and fixes the required price column: ``close`` for bars, ``mid`` for snapshot
  rows (one MBP-10 update each, labelled by ``core.snapshot_labels``). Bar labels are log-returns
  of close prices over a few bars (a tick is ~5e-5 of the price), so they are derived from
  exact float64 prices only: the store refuses prices from any other source (an f32 / bf16
  value block, whose 8 mantissa bits once turned 130 distinct closes into 2), and, given the
  instrument's ``price_tick``, refuses trade-price columns (open, high, low, close) that are
  off the tick grid or whose resolution (the gcd of their moves in ticks) is coarser than
  one tick — the signature of prices rounded by a narrower type.
- Timestamps stay on the host (int64 ns), with the session id of every bar computed once per
  quarter at upload (``calendar.session_day``), so a fold never does calendar work.
- ``log_close``: ln of the close column (float64, on the device), computed once per upload:
  every fold's labels are differences of it.
- ``segment_changes``: when a ``contract`` price column is present, the running count of
  contract changes (int32, on the device), computed once per quarter at upload: a label whose
  price window spans a roll is masked from it by index arithmetic alone.

Fast path from fxcache files
----------------------------
:meth:`DeviceStore.add_fxcache` / :meth:`DeviceStore.add_fxcaches` read the price and value
blocks of fxcache files straight into a pool of pinned chunk buffers with several threads
(``os.preadv``: the copy out of the page cache runs outside the GIL), and copy each filled
buffer to the device on a dedicated CUDA stream while the threads fill the next ones (each copy
and its two timing events queued through the CUDA driver with the GIL held, ``core.cuda_copy``). Each
chunk is also fed, in file order per block, to that block's XXH3-128 hasher on a second thread
pool (chunks go round robin over the blocks, so several blocks hash at once), and a block whose
digest differs from the file's is an ``FxCacheError`` before anything is registered: the bytes
verified are the bytes uploaded (header, timestamps and trailer are verified on open). A
buffer is refilled only after its last copy and its hash have completed, so host memory is
bounded by the pool (``io_threads + 2`` buffers of ``staging_bytes``) whatever the file size.
The value checks (finite values) and the price checks (finite, positive, on the tick grid, not
coarser than the tick) run on the device and are read back with one host sync per call.

With no CUDA device the same code runs on the CPU (no pinning, synchronous copies).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from fx_assets.core import calendar, checksum
from fx_assets.core.cuda_copy import TimedCopies
from fx_assets.core.errors import FxDataError
from fx_assets.core.fxcache import FxCache, checksum_mismatch, open_fxcache

if TYPE_CHECKING:  # torch is imported by the functions that run it: reading ValueDtype needs none
    import torch

DEFAULT_PRICE_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "mid_open", "vwap", "contract")
CLOSE_COLUMN = "close"
MID_COLUMN = "mid"
#: The price column each row unit's labels are derived from (the file's ``row_unit`` meta).
ROW_UNIT_PRICE: dict[str, str] = {"bar": CLOSE_COLUMN, "snapshot": MID_COLUMN}
SEGMENT_COLUMN = "contract"  # price column whose changes are contract rolls
TICK_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close")  # trade prices: on the tick grid
TICK_TOLERANCE = 1e-6  # |p / tick - round(p / tick)| allowed, in ticks

ValueDtype = Literal["float32", "bfloat16"]  # also the name of the torch dtype


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is available, else ``cpu``."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _from_numpy_readonly(arr: np.ndarray) -> torch.Tensor:
    """Wrap a (possibly read-only memmap) array without copying; we never write through it."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "array is not writable": we only read
        return torch.from_numpy(arr)


@dataclass(frozen=True)
class DeviceSlice:
    """Time-ordered concatenation of some quarters, resident on the device.

    ``values[i]`` / ``prices[i]`` / ``ts[i]`` are bar ``i`` of the concatenation; ``offsets[q]`` is
    the first row of ``keys[q]``. Fold code slices these tensors by index (views, no copies).
    """

    keys: tuple[str, ...]
    values: torch.Tensor  # [n, w] float32 | bfloat16, on the device
    prices: torch.Tensor  # [n, k] float64, on the device
    ts: npt.NDArray[np.int64]  # [n] host
    columns: tuple[str, ...]
    price_columns: tuple[str, ...]
    offsets: npt.NDArray[np.int64]  # [len(keys) + 1]
    sessions: npt.NDArray[np.int32]  # [n] host, session day of each bar (computed at upload)
    segment_changes: torch.Tensor | None = None  # [n] int32 on the device: contract changes so far
    log_close: torch.Tensor | None = None  # [n] float64 on the device: ln close (bar rows only)
    row_unit: str = "bar"  # what a row is: a bar, or one MBP-10 update (``snapshot``)
    price_tick: float | None = None  # the store's instrument tick (snapshot labels: half-tick mids)

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])

    @property
    def device(self) -> torch.device:
        return self.values.device

    def column_index(self, name: str) -> int:
        try:
            return self.columns.index(name)
        except ValueError:
            raise FxDataError(f"column {name!r} not in fxcache columns of {self.keys}") from None

    def price(self, name: str = CLOSE_COLUMN) -> torch.Tensor:
        """One float64 price column as a view ``[n]``."""
        try:
            j = self.price_columns.index(name)
        except ValueError:
            raise FxDataError(
                f"price column {name!r} not stored for {self.keys} (have {self.price_columns})"
            ) from None
        return self.prices[:, j]

    @property
    def close(self) -> torch.Tensor:
        return self.price(CLOSE_COLUMN)


@dataclass
class _Arena:
    """Quarters uploaded together, back to back in one allocation per block (time order per
    symbol), so that a view of consecutive quarters is a slice of it: no copy, host or device."""

    values: torch.Tensor  # [N, w] (with the fxcache row padding)
    prices: torch.Tensor  # [N, k] float64, the named price columns (a view of the padded block)
    ts: npt.NDArray[np.int64]  # [N] host
    sessions: npt.NDArray[np.int32]  # [N] host
    segment_changes: torch.Tensor | None  # [N] int32: contract changes since row 0 of the arena
    log_close: torch.Tensor | None  # [N] float64 (bar rows; None for snapshot rows)


@dataclass
class _Quarter:
    key: str
    values: torch.Tensor
    prices: torch.Tensor
    ts: npt.NDArray[np.int64]
    columns: tuple[str, ...]
    price_columns: tuple[str, ...]
    sessions: npt.NDArray[np.int32]
    segment_changes: torch.Tensor | None
    log_close: torch.Tensor | None
    arena: _Arena | None = None  # where it lives when uploaded with others (rows [row0, row0 + n))
    row0: int = 0
    row_unit: str = "bar"

    @property
    def n(self) -> int:
        return int(self.values.shape[0])


def _segment_changes(prices: torch.Tensor, pcols: Sequence[str]) -> torch.Tensor | None:
    """Running count of changes of the ``contract`` column (0 at row 0), or None without one."""
    import torch

    if SEGMENT_COLUMN not in pcols:
        return None
    seg = prices[:, list(pcols).index(SEGMENT_COLUMN)]
    c = torch.zeros(seg.shape[0], dtype=torch.int32, device=seg.device)
    if seg.shape[0] > 1:
        c[1:] = torch.cumsum(seg[1:] != seg[:-1], 0, dtype=torch.int32)
    return c


def _log_close(prices: torch.Tensor, pcols: Sequence[str], row_unit: str) -> torch.Tensor | None:
    """ln close, once per upload: every bar fold's labels difference it (``core.labels`` op for
    op). Snapshot rows have none: their labels come from the exact mid (``core.snapshot_labels``)."""
    import torch

    if row_unit != "bar":
        return None
    return torch.log(prices[:, list(pcols).index(CLOSE_COLUMN)])


def check_row_unit(where: str, row_unit: object, pcols: Sequence[str]) -> str:
    """The row unit of a quarter, checked against its price columns: a bar file needs ``close``,
    a snapshot file ``mid`` (the exact f64 prices its labels are derived from)."""
    if row_unit not in ROW_UNIT_PRICE:
        raise FxDataError(f"{where}: row_unit {row_unit!r} is not one of {sorted(ROW_UNIT_PRICE)}")
    need = ROW_UNIT_PRICE[str(row_unit)]
    if need not in pcols:
        raise FxDataError(
            f"{where}: no {need!r} price column for row_unit {row_unit!r} (price columns {tuple(pcols)})"
        )
    return str(row_unit)


def file_row_unit(fc: FxCache) -> object:
    """The row unit an fxcache file declares in its meta; files written before the snapshot row
    unit existed carry none and are bar files (the only row unit of that format)."""
    return fc.meta.get("row_unit", "bar")


def _price_flags(
    prices: torch.Tensor, pcols: Sequence[str], tick: float | None
) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor, torch.Tensor]]]:
    """Device-side price checks, no host sync: (any non-finite / non-positive price,
    [(column, off-grid count, gcd of the moves in ticks)] for each tick column)."""
    import torch

    px = prices[:, : len(pcols)]
    bad = ((~torch.isfinite(px)) | (px <= 0.0)).any()
    cols = [j for j, name in enumerate(pcols) if name in TICK_COLUMNS]
    if tick is None or not cols:
        return bad, []
    r = px[:, cols] / tick  # [n, k]: all tick columns in one pass per step
    t = torch.round(r)
    off = (torch.abs(r - t) > TICK_TOLERANCE).sum(dim=0)
    g = torch.abs(t.to(torch.int64) - t[:1].to(torch.int64))
    while g.shape[0] > 1:  # tree reduction of the gcd along the rows (log2 n launches)
        if g.shape[0] % 2:
            g = torch.cat([g, g.new_zeros((1, g.shape[1]))])
        g = torch.gcd(g[0::2], g[1::2])
    return bad, [(j, off[i], g[0, i]) for i, j in enumerate(cols)]


def _raise_price_faults(
    where: str,
    prices: torch.Tensor,
    pcols: Sequence[str],
    tick: float | None,
    bad: bool,
    grid: list[tuple[int, int, int]],
) -> None:
    import torch

    if bad:
        px = prices[:, : len(pcols)]
        r, c = torch.nonzero((~torch.isfinite(px)) | (px <= 0))[0].tolist()
        raise FxDataError(f"{where}: price column {pcols[c]!r} not finite/positive at bar {r}")
    for j, off, g in grid:
        if off:
            raise FxDataError(
                f"{where}: price column {pcols[j]!r} has {off} values off the {tick} tick grid: prices "
                "must be the exact float64 prices of the fxcache price block"
            )
        if g > 1:
            raise FxDataError(
                f"{where}: price column {pcols[j]!r} moves only in multiples of {g} ticks ({g * (tick or 0.0):g}): "
                f"its resolution is coarser than the {tick} tick (prices rounded by a narrower type?); "
                "prices must be the exact float64 prices of the fxcache price block"
            )


@dataclass
class _Region:
    """One block of an fxcache file on its way to its device tensor (fast path)."""

    name: str  # the fxcache checksum region: price | values
    offset: int  # byte offset of the block in the file
    end: int  # end of its checksummed region (the block and its zero padding)
    digest: bytes  # XXH3-128 written at creation
    n: int
    w: int
    src: str  # stored dtype: f32 | bf16 | f64
    rowbytes: int
    dest: torch.Tensor  # [n, w] on the device
    hasher: Any = None

    @property
    def direct(self) -> bool:
        """Whether the file's bytes can land in the destination as they are."""
        import torch

        return getattr(torch, _WIRE_DTYPE[self.src]) == self.dest.dtype


@dataclass
class _FileSpec:
    """One fxcache file on its way to the device (fast path): its price and value blocks."""

    key: str
    path: Path
    fc: FxCache
    n: int
    ts: npt.NDArray[np.int64]
    sessions: npt.NDArray[np.int32]
    cols: tuple[str, ...]
    pcols: tuple[str, ...]
    values: _Region
    prices: _Region
    row_unit: str = "bar"


def _layout(sp: _FileSpec) -> tuple[Any, ...]:
    """What files must share to sit back to back in one allocation."""
    return (sp.values.w, sp.prices.w, sp.cols, sp.pcols, sp.row_unit)


_WIRE_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f64": "float64"}  # stored dtype -> torch dtype name


def _decode_wire(raw: torch.Tensor, src: str, rows: int, w: int) -> torch.Tensor:
    """View raw little-endian bytes of ``rows`` fxcache rows as their stored dtype ``[rows, w]``."""
    import torch

    return raw.view(getattr(torch, _WIRE_DTYPE[src])).view(rows, w)


class _nullctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class StoreStats:
    """Counters of the store: how often and how much crossed the host→device bus."""

    uploads: int = 0
    bytes_uploaded: int = 0
    upload_seconds: float = 0.0
    uploads_by_key: dict[str, int] = field(default_factory=dict)
    concat_builds: int = 0
    concat_hits: int = 0
    concat_zero_copy: int = 0  # views that are slices of one upload (no copy at all)
    device_copy_bytes: int = 0
    pinned_staging: bool = False
    chunks: int = 0
    # fxcache fast path: seconds the copy stream spent in host→device copies (CUDA events),
    # and the bytes those copies moved (value blocks only)
    h2d_seconds: float = 0.0
    h2d_bytes: int = 0
    staging_pool_bytes: int = 0
    # wall-clock split of the fast path: open/validate headers + allocate destinations, pinned
    # pool allocation (once per store), the read/copy pipeline, prices + checks
    open_seconds: float = 0.0
    staging_alloc_seconds: float = 0.0
    stream_seconds: float = 0.0
    finish_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "uploads": self.uploads,
            "bytes_uploaded": self.bytes_uploaded,
            "upload_seconds": self.upload_seconds,
            "uploads_by_key": dict(self.uploads_by_key),
            "concat_builds": self.concat_builds,
            "concat_hits": self.concat_hits,
            "concat_zero_copy": self.concat_zero_copy,
            "device_copy_bytes": self.device_copy_bytes,
            "pinned_staging": self.pinned_staging,
            "chunks": self.chunks,
            "h2d_seconds": self.h2d_seconds,
            "h2d_bytes": self.h2d_bytes,
            "staging_pool_bytes": self.staging_pool_bytes,
            "open_seconds": self.open_seconds,
            "staging_alloc_seconds": self.staging_alloc_seconds,
            "stream_seconds": self.stream_seconds,
            "finish_seconds": self.finish_seconds,
        }


class DeviceStore:
    """Holds the fxcache value blocks of loaded quarters on one device for a whole run.

    ``chunk_rows`` bounds the pinned host staging memory to ``2 * chunk_rows * w`` words (two
    buffers, so the host fills one while the device copies from the other). ``max_views`` is how
    many concatenations (distinct key sets) stay cached; each costs device memory equal to its
    quarters, so a rolling walk-forward keeps only the last few. ``price_tick`` (the
    instrument's tick, price units) switches on the tick-grid and resolution checks of the
    trade-price columns.
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        value_dtype: ValueDtype = "float32",
        chunk_rows: int = 1 << 16,
        max_views: int = 2,
        *,
        staging_bytes: int = 8 << 20,
        io_threads: int | None = None,
        price_tick: float | None = None,
    ) -> None:
        import torch

        if price_tick is not None and not (np.isfinite(price_tick) and price_tick > 0):
            raise FxDataError(f"DeviceStore: price_tick must be finite and > 0, got {price_tick!r}")
        if value_dtype not in get_args(ValueDtype):
            raise FxDataError(f"DeviceStore: value_dtype must be float32 or bfloat16, got {value_dtype!r}")
        if chunk_rows <= 0 or max_views <= 0 or staging_bytes <= 0:
            raise FxDataError("DeviceStore: chunk_rows, max_views and staging_bytes must be positive")
        self._device = torch.device(device) if device is not None else default_device()
        self._value_dtype = getattr(torch, value_dtype)
        self._chunk_rows = int(chunk_rows)
        self._max_views = int(max_views)
        self._quarters: dict[str, _Quarter] = {}
        self._views: OrderedDict[tuple[str, ...], DeviceSlice] = OrderedDict()
        self._stats = StoreStats()
        self._staging_bytes = int(staging_bytes)
        self._io_threads = int(io_threads) if io_threads else max(1, min(8, os.cpu_count() or 1))
        self._pool: list[torch.Tensor] = []  # pinned chunk buffers of the fxcache fast path
        self._copy_stream: Any = None
        self._tick = float(price_tick) if price_tick is not None else None

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def value_dtype(self) -> torch.dtype:
        return self._value_dtype

    def keys(self) -> list[str]:
        return list(self._quarters)

    def __contains__(self, key: object) -> bool:
        return key in self._quarters

    def stats(self) -> dict[str, Any]:
        """Upload / copy counters (see :class:`StoreStats`) plus resident bytes."""
        d = self._stats.as_dict()
        d["resident_bytes"] = sum(
            q.values.numel() * q.values.element_size() + q.prices.numel() * 8 for q in self._quarters.values()
        )
        d["quarters"] = len(self._quarters)
        d["cached_views"] = len(self._views)
        d["device"] = str(self._device)
        return d

    # ------------------------------------------------------------------ upload
    def add_quarter(
        self,
        key: str,
        ts: npt.NDArray[np.int64],
        values: np.ndarray,
        columns: Sequence[str],
        *,
        price_columns: Sequence[str] | None = None,
        prices: npt.NDArray[np.float64] | None = None,
        row_unit: str = "bar",
    ) -> None:
        """Upload one quarter's block once.

        ``values`` is ``[n, w]`` float32, float64, or uint16 (bfloat16 bit patterns), e.g. a
        memmap of an fxcache value block; it is read chunk by chunk. ``columns`` names the first
        ``len(columns) <= w`` columns; the rest is row padding. ``price_columns`` names the
        price columns (default: those of :data:`DEFAULT_PRICE_COLUMNS` present in ``columns``);
        their float64 values are ``prices`` (``[n, len(price_columns)]``, dtype float64), or,
        without it, those columns of a float64 ``values`` block. Prices are never taken from an
        f32 / bf16 block. ``row_unit``: what a row is (``bar``: needs a ``close`` price column;
        ``snapshot``: one MBP-10 update, needs ``mid``).
        """
        import torch

        if key in self._quarters:
            raise FxDataError(f"DeviceStore: quarter {key!r} is already resident (uploads happen once)")
        ts = np.asarray(ts)
        if ts.ndim != 1 or ts.dtype != np.int64:
            raise FxDataError(f"{key}: ts must be 1-D int64 ns, got {ts.dtype} shape {ts.shape}")
        if values.ndim != 2:
            raise FxDataError(f"{key}: values must be 2-D [n, w], got shape {values.shape}")
        n, w = values.shape
        cols = tuple(columns)
        # fxcache rows are zero-padded to a multiple of 8 values: trailing unnamed columns are
        # padding, uploaded with the block (one copy) and never addressed.
        if len(cols) > w or len(set(cols)) != len(cols) or not cols:
            raise FxDataError(f"{key}: {len(cols)} column names (unique: {len(set(cols))}) for width {w}")
        if ts.shape[0] != n:
            raise FxDataError(f"{key}: {ts.shape[0]} timestamps for {n} value rows")
        if n == 0:
            raise FxDataError(f"{key}: empty quarter")
        bad = np.flatnonzero(np.diff(ts) < 0)
        if bad.size:
            raise FxDataError(f"{key}: ts not time-ordered at bar {int(bad[0]) + 1}")
        src_kind = values.dtype
        if src_kind not in (np.float32, np.float64, np.uint16):
            raise FxDataError(f"{key}: values dtype {src_kind} (want float32, float64 or uint16=bf16)")
        is_bf16 = src_kind == np.uint16

        pcols = (
            tuple(price_columns)
            if price_columns is not None
            else tuple(c for c in cols if c in DEFAULT_PRICE_COLUMNS)
        )
        row_unit = check_row_unit(key, row_unit, pcols)
        if prices is None:
            if src_kind != np.float64:
                kind = "bf16" if is_bf16 else str(src_kind)
                raise FxDataError(
                    f"{key}: {kind} values cannot carry prices exactly; pass prices= (the float64 price "
                    f"block) for {pcols}"
                )
            missing = [c for c in pcols if c not in cols]
            if missing:
                raise FxDataError(f"{key}: price columns {missing} not in columns")
            prices_host = np.ascontiguousarray(values[:, [cols.index(c) for c in pcols]], dtype=np.float64)
        else:
            if not isinstance(prices, np.ndarray) or prices.dtype != np.float64:
                raise FxDataError(
                    f"{key}: prices must be a float64 array, got {getattr(prices, 'dtype', prices)}"
                )
            prices_host = np.ascontiguousarray(prices)
            if prices_host.shape != (n, len(pcols)):
                raise FxDataError(f"{key}: prices shape {prices_host.shape}, want {(n, len(pcols))}")

        t0 = time.perf_counter()
        dev = self._device
        cuda = dev.type == "cuda"
        if is_bf16:
            wire_dtype = torch.int16  # raw bf16 bits, 2 bytes per value on the bus
            src_view = values.view(np.int16)
        else:
            wire_dtype = self._value_dtype
            src_view = values
        dest = torch.empty((n, w), dtype=self._value_dtype, device=dev)
        # bf16 bits land straight in a bf16 destination (viewed as int16); for an f32
        # destination they go through a small device scratch and are widened there.
        direct = not is_bf16 or self._value_dtype == torch.bfloat16
        dest_wire = dest.view(torch.int16) if (is_bf16 and direct) else dest
        rows = min(self._chunk_rows, n)
        bufs = [torch.empty((rows, w), dtype=wire_dtype, pin_memory=cuda) for _ in range(2)]
        scratch = (
            [torch.empty((rows, w), dtype=torch.int16, device=dev) for _ in range(2)] if not direct else []
        )
        events: list[Any] = [None, None]
        n_chunks = 0
        for ci, i in enumerate(range(0, n, rows)):
            j = min(i + rows, n)
            m = j - i
            b = ci % 2
            if events[b] is not None:
                events[b].synchronize()  # the device is done reading this pinned buffer
            chunk = src_view[i:j]
            buf = bufs[b][:m]
            buf.copy_(_from_numpy_readonly(np.ascontiguousarray(chunk)))  # host-side cast/pack
            if direct:
                dest_wire[i:j].copy_(buf, non_blocking=cuda)
            else:
                sc = scratch[b][:m]
                sc.copy_(buf, non_blocking=cuda)
                dest[i:j].copy_(sc.view(torch.bfloat16))
            if cuda:
                ev = torch.cuda.Event()
                ev.record()
                events[b] = ev
            n_chunks += 1
        prices_dev = torch.from_numpy(prices_host).to(dev)
        bad_px, grid = _price_flags(prices_dev, pcols, self._tick)
        flags = torch.stack([bad_px.long(), *[x for _, off, g in grid for x in (off.long(), g.long())]])
        got = flags.cpu().tolist()  # the one host sync
        _raise_price_faults(
            key,
            prices_dev,
            pcols,
            self._tick,
            bool(got[0]),
            [(j, got[1 + 2 * k], got[2 + 2 * k]) for k, (j, _, _) in enumerate(grid)],
        )
        if cuda:
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0

        self._quarters[key] = _Quarter(
            key,
            dest,
            prices_dev,
            ts.copy(),
            cols,
            pcols,
            calendar.session_day(ts).astype(np.int32),
            _segment_changes(prices_dev, pcols),
            _log_close(prices_dev, pcols, row_unit),
            row_unit=row_unit,
        )
        st = self._stats
        st.uploads += 1
        st.uploads_by_key[key] = st.uploads_by_key.get(key, 0) + 1
        st.bytes_uploaded += (
            n * w * (2 if wire_dtype in (torch.int16, torch.bfloat16) else 4) + prices_host.nbytes
        )
        st.upload_seconds += elapsed
        st.pinned_staging = st.pinned_staging or (cuda and bool(bufs[0].is_pinned()))
        st.chunks += n_chunks

    # ------------------------------------------------------------------ fxcache fast path
    def add_fxcache(self, key: str, path: Path | str) -> None:
        """Upload one fxcache file's blocks once (threaded reads into pinned chunks).

        Same result as ``add_quarter(key, fc.ts, fc.values, fc.value_column_names,
        price_columns=fc.group_names("price"), prices=fc.prices)`` on ``fc = open_fxcache(path)``
        (with the price block's padding kept), but no block passes through a memmap: each is read
        with ``os.preadv`` into pinned buffers and copied on a separate CUDA stream.
        """
        self.add_fxcaches([(key, path)])

    def add_fxcaches(self, items: Sequence[tuple[str, Path | str]]) -> None:
        """Upload several fxcache files (``(key, path)`` pairs) through one read/copy pipeline.

        The files' structure, checksums and timestamps are validated by ``open_fxcache`` (its
        finite scan is replaced by a device-side check); each file's f64 price block and its
        value block go to the device in one copy each, then the checks of :meth:`add_quarter`
        run on the device. Nothing is registered unless every file passes.
        """
        if not items:
            return
        keys = [k for k, _ in items]
        dup = [k for k in keys if keys.count(k) > 1 or k in self._quarters]
        if dup:
            raise FxDataError(f"DeviceStore: quarter {dup[0]!r} is already resident or repeated")
        t0 = time.perf_counter()
        specs = self._open_specs(items)
        try:
            arenas = self._place_specs(specs)
        except BaseException:
            for sp in specs:
                sp.fc.close()
            raise
        t1 = time.perf_counter()
        try:
            self._stream_specs(specs)
            t2 = time.perf_counter()
            self._finish_specs(specs)
        finally:
            for sp in specs:
                sp.fc.close()
        t3 = time.perf_counter()
        self._stats.open_seconds += t1 - t0
        self._stats.stream_seconds += t2 - t1
        self._stats.finish_seconds += t3 - t2
        elapsed = time.perf_counter() - t0
        st = self._stats
        for group, (values, prices) in arenas:
            pcols = group[0].pcols
            named = prices[:, : len(pcols)]  # a view: the padding stays unaddressed
            arena = _Arena(
                values=values,
                prices=named,
                ts=np.concatenate([sp.ts for sp in group]),
                sessions=np.concatenate([sp.sessions for sp in group]),
                segment_changes=_segment_changes(named, pcols),
                log_close=_log_close(named, pcols, group[0].row_unit),
            )
            row0 = 0
            for sp in group:
                a, b = row0, row0 + sp.n
                self._quarters[sp.key] = _Quarter(
                    sp.key,
                    arena.values[a:b],
                    arena.prices[a:b],
                    arena.ts[a:b],
                    sp.cols,
                    pcols,
                    arena.sessions[a:b],
                    None if arena.segment_changes is None else arena.segment_changes[a:b],
                    None if arena.log_close is None else arena.log_close[a:b],
                    arena,
                    a,
                    sp.row_unit,
                )
                row0 = b
        for sp in specs:
            st.uploads += 1
            st.uploads_by_key[sp.key] = st.uploads_by_key.get(sp.key, 0) + 1
            st.bytes_uploaded += sp.n * (sp.values.rowbytes + sp.prices.rowbytes)
        st.upload_seconds += elapsed

    def _open_specs(self, items: Sequence[tuple[str, Path | str]]) -> list[_FileSpec]:
        """Open and validate the files in parallel (header, trailer, checksums, ts order, sessions)."""
        with ThreadPoolExecutor(max_workers=max(1, min(self._io_threads, len(items)))) as ex:
            futs = [ex.submit(self._open_spec, k, Path(p)) for k, p in items]
            errors = [f.exception() for f in futs]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            for f, e in zip(futs, errors, strict=True):
                if e is None:
                    f.result().fc.close()
            raise first
        return [f.result() for f in futs]

    def _open_spec(self, key: str, path: Path) -> _FileSpec:
        # the header, timestamps and trailer are checked against the file's checksums here; the
        # price and value blocks are hashed as they stream through the pinned buffers (the bytes
        # that reach the device are the bytes verified); the finite scan runs on the device
        import torch

        fc = open_fxcache(path, verify_finite=False, verify_checksums=("ts", "trailer"))
        try:
            h = fc.header
            n = int(h.n_bars)
            if n == 0:
                raise FxDataError(f"{key} ({path}): empty quarter")
            pcols = tuple(fc.group_names("price"))
            row_unit = check_row_unit(f"{key} ({path})", file_row_unit(fc), pcols)
            ts = np.array(fc.ts, dtype=np.int64)  # open_fxcache checked the order
            vw, pw = int(h.row_width), int(h.price_width)
            return _FileSpec(
                key=key,
                path=path,
                fc=fc,
                n=n,
                ts=ts,
                sessions=calendar.session_day(ts).astype(np.int32),  # once per quarter, here
                cols=tuple(fc.value_column_names),
                pcols=pcols,
                values=_Region(
                    "values",
                    int(h.values_offset),
                    int(h.trailer_offset),
                    h.values_checksum,
                    n,
                    vw,
                    fc.dtype,
                    vw * int(h.itemsize),
                    torch.empty(0),  # the destination, allocated by _place_specs
                ),
                prices=_Region(
                    "price",
                    int(h.price_offset),
                    int(h.values_offset),
                    h.price_checksum,
                    n,
                    pw,
                    "f64",
                    pw * 8,
                    torch.empty(0),  # the destination, allocated by _place_specs
                ),
                row_unit=row_unit,
            )
        except BaseException:
            fc.close()
            raise

    def _place_specs(
        self, specs: list[_FileSpec]
    ) -> list[tuple[list[_FileSpec], tuple[torch.Tensor, torch.Tensor]]]:
        """Allocate the device destinations: each maximal run of consecutive files with the same
        layout gets one values and one prices allocation, the files back to back in the given
        order (the loader passes each symbol's quarters in time order), so that a fold's view
        of consecutive quarters is a slice of them (see :meth:`concat_view`)."""
        import torch

        groups: list[list[_FileSpec]] = []
        for sp in specs:
            if groups and _layout(groups[-1][-1]) == _layout(sp) and groups[-1][-1].ts[-1] <= sp.ts[0]:
                groups[-1].append(sp)
            else:
                groups.append([sp])
        out = []
        for group in groups:
            n = sum(sp.n for sp in group)
            first = group[0]
            values = torch.empty((n, first.values.w), dtype=self._value_dtype, device=self._device)
            prices = torch.empty((n, first.prices.w), dtype=torch.float64, device=self._device)
            row0 = 0
            for sp in group:
                sp.values.dest = values[row0 : row0 + sp.n]
                sp.prices.dest = prices[row0 : row0 + sp.n]
                row0 += sp.n
            out.append((group, (values, prices)))
        return out

    def _staging_pool(self, n_buf: int, nbytes: int) -> list[torch.Tensor]:
        """Pinned (on CUDA) chunk buffers, allocated once per store and reused across calls."""
        import torch

        if len(self._pool) < n_buf or self._pool[0].numel() < nbytes:
            t0 = time.perf_counter()
            pin = self._device.type == "cuda"
            self._pool = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(n_buf)]
            self._stats.staging_pool_bytes = n_buf * nbytes
            self._stats.pinned_staging = self._stats.pinned_staging or (pin and self._pool[0].is_pinned())
            self._stats.staging_alloc_seconds += time.perf_counter() - t0
        return self._pool[:n_buf]

    def _stream_specs(self, specs: list[_FileSpec]) -> None:
        """Read every block chunk by chunk (threads) and copy it to its device destination."""
        import torch

        cuda = self._device.type == "cuda"
        regions = [(sp, r) for sp in specs for r in (sp.prices, sp.values)]
        max_row = max(r.rowbytes for _, r in regions)
        chunk_bytes = max(self._staging_bytes // max_row, 1) * max_row
        per_region = []
        for sp, r in regions:
            rows = max(1, chunk_bytes // r.rowbytes)
            per_region.append([(sp, r, i, min(i + rows, r.n)) for i in range(0, r.n, rows)])
        # round robin over the blocks: a block's chunks are hashed in order, so consecutive
        # chunks of different blocks let the hashes of several blocks run in parallel
        chunks: list[tuple[_FileSpec, _Region, int, int]] = [
            c for step in itertools.zip_longest(*per_region) for c in step if c is not None
        ]
        n_threads = min(self._io_threads, len(chunks))
        n_buf = min(n_threads + 2, len(chunks))  # every thread busy, two buffers in the copy queue
        bufs = self._staging_pool(n_buf, chunk_bytes)
        host_views = [b.numpy() for b in bufs]
        done: list[Any] = [None] * n_buf  # event of the last copy out of each buffer
        hashed: list[Any] = [None] * n_buf  # hash of the last chunk read into each buffer
        for _, r in regions:
            r.hasher = checksum.new_hasher()
        fds: dict[Path, int] = {}
        lock = threading.Lock()
        if cuda and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=self._device)
        stream = self._copy_stream
        # a device scratch for blocks stored in another dtype than the store's (widened there)
        need_scratch = any(not r.direct for _, r in regions)
        scratch = torch.empty(chunk_bytes, dtype=torch.uint8, device=self._device) if need_scratch else None

        def fd_of(path: Path) -> int:
            with lock:
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                return fds[path]

        def read(ci: int, b: int) -> int:
            sp, r, i, j = chunks[ci]
            ev, hf = done[b], hashed[b]
            if ev is not None:
                ev.synchronize()  # the device has finished reading this buffer
            if hf is not None:
                hf.result()  # and so has the hasher
            nbytes = (j - i) * r.rowbytes
            mv = host_views[b].data[:nbytes]
            fd, off, got = fd_of(sp.path), r.offset + i * r.rowbytes, 0
            while got < nbytes:
                k = os.preadv(fd, [mv[got:]], off + got)
                if k <= 0:
                    raise FxDataError(f"{sp.key} ({sp.path}): block truncated at byte {off + got}")
                got += k
            return nbytes

        def digest(r: _Region, b: int, nbytes: int, before: Any) -> None:
            # a region's chunks are hashed in file order (each task waits for the one before;
            # tasks start in submission order, so that one is running or done)
            if before is not None:
                before.result()
            r.hasher.update(host_views[b].data[:nbytes])

        timings: list[tuple[Any, Any, int]] = []
        last_hash: dict[int, Any] = {}
        # the copies and their timing events go through the driver with the GIL held
        # (core/cuda_copy.py says why); torch's calls where the driver API is not at hand
        use_driver = cuda and TimedCopies.available(stream.device.index)
        timed = TimedCopies(stream.cuda_stream) if use_driver else None
        try:
            with (
                ThreadPoolExecutor(max_workers=n_threads) as ex,
                ThreadPoolExecutor(max_workers=n_threads) as hx,
            ):
                futs = {ci: ex.submit(read, ci, ci % n_buf) for ci in range(n_buf)}
                for ci, (_sp, r, i, j) in enumerate(chunks):
                    b = ci % n_buf
                    nbytes = futs.pop(ci).result()
                    hashed[b] = last_hash[id(r)] = hx.submit(digest, r, b, nbytes, last_hash.get(id(r)))
                    src = bufs[b][:nbytes]
                    # every view and event is made before ev0 is recorded: each torch call
                    # releases the GIL and may wait to get it back from the reader and hasher
                    # threads, and that wait would sit inside the timed copy
                    if r.direct:
                        dst = r.dest.view(-1).view(torch.uint8)[i * r.rowbytes : j * r.rowbytes]
                    else:
                        assert scratch is not None
                        dst = scratch[:nbytes]
                    if timed is not None:
                        timed.copy(dst.data_ptr(), src.data_ptr(), nbytes)
                        with torch.cuda.stream(stream):
                            if not r.direct:
                                r.dest[i:j].copy_(_decode_wire(dst, r.src, j - i, r.w))
                            done[b] = torch.cuda.Event()
                            done[b].record(stream)
                    else:
                        ev0 = torch.cuda.Event(enable_timing=True) if cuda else None
                        ev1 = torch.cuda.Event(enable_timing=True) if cuda else None
                        with torch.cuda.stream(stream) if cuda else _nullctx():
                            if ev0 is not None:
                                ev0.record(stream)
                            dst.copy_(src, non_blocking=cuda)
                            if ev1 is not None:
                                ev1.record(stream)
                            if not r.direct:
                                r.dest[i:j].copy_(_decode_wire(dst, r.src, j - i, r.w))
                            if ev1 is not None:
                                timings.append((ev0, ev1, nbytes))
                        done[b] = ev1
                    nxt = ci + n_buf
                    if nxt < len(chunks):
                        futs[nxt] = ex.submit(read, nxt, b)
                for hf in last_hash.values():
                    hf.result()
            if cuda:
                torch.cuda.current_stream(self._device).wait_stream(stream)
                stream.synchronize()  # the pinned pool may be refilled by the next call
            for sp, r in regions:  # the zero padding after the block, then the comparison
                lo = r.offset + r.n * r.rowbytes
                r.hasher.update(os.pread(fd_of(sp.path), r.end - lo, lo))
                if r.hasher.digest() != r.digest:
                    raise checksum_mismatch(sp.path, r.name, r.offset, r.end)
            st = self._stats
            if timed is not None:
                busy, moved = timed.busy_seconds()
                st.h2d_seconds += busy
                st.h2d_bytes += moved
        finally:
            for fd in fds.values():
                os.close(fd)
            if timed is not None:
                timed.close()
        st.chunks += len(chunks)
        for ev0, ev1, nbytes in timings:
            st.h2d_seconds += ev0.elapsed_time(ev1) / 1e3
            st.h2d_bytes += nbytes

    def _finish_specs(self, specs: list[_FileSpec]) -> None:
        """The value and price checks on the device, with one host sync for all files."""
        import torch

        flags = []
        grids = []
        for sp in specs:
            bad_px, grid = _price_flags(sp.prices.dest, sp.pcols, self._tick)
            grids.append(grid)
            flags.append(bad_px.long().view(1))
            flags.append(
                (~torch.isfinite(sp.values.dest.sum(dim=0))).any().long().view(1)
            )  # NaN/Inf anywhere
            for _, off, g in grid:
                flags.append(torch.stack([off.long(), g.long()]))
        got = torch.cat(flags).cpu().tolist()  # the one host sync
        k = 0
        for sp, grid in zip(specs, grids, strict=True):
            bad_px, bad_v = got[k], got[k + 1]
            cells = [(j, got[k + 2 + 2 * m], got[k + 3 + 2 * m]) for m, (j, _, _) in enumerate(grid)]
            k += 2 + 2 * len(grid)
            where = f"{sp.key} ({sp.path})"
            _raise_price_faults(where, sp.prices.dest, sp.pcols, self._tick, bool(bad_px), cells)
            if bad_v:
                hit = torch.nonzero(~torch.isfinite(sp.values.dest[:, : len(sp.cols)]))
                if hit.numel():  # (a finite block whose f32 column sum overflowed is fine)
                    r, c = hit[0].tolist()
                    raise FxDataError(f"{where}: column {sp.cols[c]!r} is NaN/Inf at bar {r}")

    def drop_quarter(self, key: str) -> None:
        """Forget a quarter (and any cached view that contains it). A quarter uploaded with
        others shares their allocation: its memory returns when the last of them is dropped."""
        self._quarters.pop(key)
        for k in [k for k in self._views if key in k]:
            del self._views[k]

    # ------------------------------------------------------------------ fold views
    def concat_view(self, keys: Sequence[str]) -> DeviceSlice:
        """Time-ordered concatenation of the named resident quarters (built once per key set)."""
        import torch

        kt = tuple(keys)
        if not kt:
            raise FxDataError("concat_view: no quarter keys")
        cached = self._views.get(kt)
        if cached is not None:
            self._views.move_to_end(kt)
            self._stats.concat_hits += 1
            return cached
        missing = [k for k in kt if k not in self._quarters]
        if missing:
            raise FxDataError(f"concat_view: quarters {missing} are not resident (add_quarter first)")
        qs = [self._quarters[k] for k in kt]
        for a, b in itertools.pairwise(qs):
            if a.row_unit != b.row_unit:
                raise FxDataError(f"concat_view: {b.key} has row unit {b.row_unit!r}, {a.key} {a.row_unit!r}")
            if a.columns != b.columns or a.price_columns != b.price_columns:
                raise FxDataError(f"concat_view: column layout of {b.key} differs from {a.key}")
            if a.ts[-1] > b.ts[0]:
                raise FxDataError(
                    f"concat_view: {b.key} starts before {a.key} ends (keys must be in time order)"
                )
        lens = np.array([q.n for q in qs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        arena = qs[0].arena
        if len(qs) == 1:  # the resident tensors themselves
            q = qs[0]
            values, prices, ts, sessions = q.values, q.prices, q.ts, q.sessions
            seg, logc = q.segment_changes, q.log_close
        elif arena is not None and all(
            nxt.arena is arena and nxt.row0 == cur.row0 + cur.n for cur, nxt in itertools.pairwise(qs)
        ):
            # back to back in one upload: a slice of it, no copy on the device or the host
            lo, hi = qs[0].row0, qs[-1].row0 + qs[-1].n
            values, prices, ts, sessions = (
                arena.values[lo:hi],
                arena.prices[lo:hi],
                arena.ts[lo:hi],
                arena.sessions[lo:hi],
            )
            seg = None if arena.segment_changes is None else arena.segment_changes[lo:hi]
            logc = None if arena.log_close is None else arena.log_close[lo:hi]
            self._stats.concat_zero_copy += 1
        else:
            values = torch.cat([q.values for q in qs], dim=0)  # device→device, once per key set
            prices = torch.cat([q.prices for q in qs], dim=0)
            self._stats.device_copy_bytes += values.numel() * values.element_size() + prices.numel() * 8
            ts = np.concatenate([q.ts for q in qs])
            sessions = np.concatenate([q.sessions for q in qs])
            seg = self._concat_segment_changes(qs)
            lcs = [q.log_close for q in qs]
            logc = None if any(c is None for c in lcs) else torch.cat([c for c in lcs if c is not None])
        view = DeviceSlice(
            keys=kt,
            values=values,
            prices=prices,
            ts=ts,
            columns=qs[0].columns,
            price_columns=qs[0].price_columns,
            offsets=offsets,
            sessions=sessions,
            segment_changes=seg,
            log_close=logc,
            row_unit=qs[0].row_unit,
            price_tick=self._tick,
        )
        self._stats.concat_builds += 1
        self._views[kt] = view
        while len(self._views) > self._max_views:
            self._views.popitem(last=False)
        return view

    @staticmethod
    def _concat_segment_changes(qs: Sequence[_Quarter]) -> torch.Tensor | None:
        """The quarters' change counts continued across their boundaries (device ops, no sync)."""
        import torch

        if any(q.segment_changes is None for q in qs):
            return None
        j = qs[0].price_columns.index(SEGMENT_COLUMN)
        parts, base = [], None
        for prev, q in zip([None, *qs[:-1]], qs, strict=True):
            c = q.segment_changes
            assert c is not None
            c = c - c[:1]  # a quarter's counts start where its arena's left off: rebase them to 0
            if prev is not None:
                pc = prev.segment_changes
                assert pc is not None
                step = (q.prices[0, j] != prev.prices[-1, j]).to(torch.int32)
                span = pc[-1] - pc[0] + step  # changes within prev, plus the one at the boundary
                base = span if base is None else base + span
                c = c + base
            parts.append(c)
        return torch.cat(parts)
