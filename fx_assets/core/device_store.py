"""Device-resident store of fxcache quarters: upload each quarter once, slice per fold by index.

Owns the host→device path of the training stage (DESIGN §6): every quarter's value block is
uploaded exactly once per store (one run), staged through a small pinned host buffer in chunks
so host memory stays bounded whatever the quarter size, and kept on the device for the whole
run. Folds never copy from the host again: :meth:`DeviceStore.concat_view` hands back a
:class:`DeviceSlice` — the time-ordered concatenation of the named quarters, built once per
distinct key set by a device→device ``torch.cat`` (or a plain view for a single quarter) — and
fold code slices it by index.

Layout on the device, per quarter
---------------------------------
- ``values``: ``[n, w]`` in the store's value dtype (float32 by default, or bfloat16), every
  column of the fxcache row in file order. A uint16 source is taken as bfloat16 bit patterns
  (the fxcache ``bf16`` value dtype) and moved as 2-byte words, so a bf16 cache crosses the bus
  at half the f32 size.
- ``prices``: ``[n, k]`` float64, the *price columns* (by default whichever of ``open``,
  ``high``, ``low``, ``close``, ``mid_open``, ``vwap`` are present; ``close`` is required).
  Labels are log-returns of close prices over a few bars (a tick is ~5e-5 of the price), so
  they are derived from this exact float64 copy, never from the f32/bf16 value block. A bf16
  value block cannot hold prices at all (8 mantissa bits: steps of 16-32 points at ES levels),
  so a bf16 source must pass its prices separately (``prices=``) or the upload is refused.
- Timestamps stay on the host (int64 ns): only fold boundaries and session ids need them.

With no CUDA device the same code runs on the CPU (no pinning, synchronous copies).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from fx_assets.core.errors import FxDataError

DEFAULT_PRICE_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "mid_open", "vwap")
CLOSE_COLUMN = "close"

ValueDtype = Literal["float32", "bfloat16"]
_TORCH_VALUE_DTYPE: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _from_numpy_readonly(arr: np.ndarray) -> torch.Tensor:
    """Wrap a (possibly read-only memmap) array without copying; we never write through it."""
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
class _Quarter:
    key: str
    values: torch.Tensor
    prices: torch.Tensor
    ts: npt.NDArray[np.int64]
    columns: tuple[str, ...]
    price_columns: tuple[str, ...]


@dataclass
class StoreStats:
    """Counters of the store: how often and how much crossed the host→device bus."""

    uploads: int = 0
    bytes_uploaded: int = 0
    upload_seconds: float = 0.0
    uploads_by_key: dict[str, int] = field(default_factory=dict)
    concat_builds: int = 0
    concat_hits: int = 0
    device_copy_bytes: int = 0
    pinned_staging: bool = False
    chunks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "uploads": self.uploads,
            "bytes_uploaded": self.bytes_uploaded,
            "upload_seconds": self.upload_seconds,
            "uploads_by_key": dict(self.uploads_by_key),
            "concat_builds": self.concat_builds,
            "concat_hits": self.concat_hits,
            "device_copy_bytes": self.device_copy_bytes,
            "pinned_staging": self.pinned_staging,
            "chunks": self.chunks,
        }


class DeviceStore:
    """Holds the fxcache value blocks of loaded quarters on one device for a whole run.

    ``chunk_rows`` bounds the pinned host staging memory to ``2 * chunk_rows * w`` words (two
    buffers, so the host fills one while the device copies from the other). ``max_views`` is how
    many concatenations (distinct key sets) stay cached; each costs device memory equal to its
    quarters, so a rolling walk-forward keeps only the last few.
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        value_dtype: ValueDtype = "float32",
        chunk_rows: int = 1 << 16,
        max_views: int = 2,
    ) -> None:
        if value_dtype not in _TORCH_VALUE_DTYPE:
            raise FxDataError(f"DeviceStore: value_dtype must be float32 or bfloat16, got {value_dtype!r}")
        if chunk_rows <= 0 or max_views <= 0:
            raise FxDataError("DeviceStore: chunk_rows and max_views must be positive")
        self._device = torch.device(device) if device is not None else default_device()
        self._value_dtype = _TORCH_VALUE_DTYPE[value_dtype]
        self._chunk_rows = int(chunk_rows)
        self._max_views = int(max_views)
        self._quarters: dict[str, _Quarter] = {}
        self._views: OrderedDict[tuple[str, ...], DeviceSlice] = OrderedDict()
        self._stats = StoreStats()

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
    ) -> None:
        """Upload one quarter's fxcache block once.

        ``values`` is ``[n, w]`` float32, float64, or uint16 (bfloat16 bit patterns), e.g. a
        memmap of the fxcache value block; it is read chunk by chunk. ``columns`` names the first
        ``len(columns) <= w`` columns; the rest is row padding. ``price_columns`` names the
        columns kept in float64 (default: those of :data:`DEFAULT_PRICE_COLUMNS` present);
        ``prices`` (``[n, len(price_columns)]`` float64) must be given for a bf16 source.
        """
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
        if CLOSE_COLUMN not in pcols:
            raise FxDataError(f"{key}: no {CLOSE_COLUMN!r} price column (price columns {pcols})")
        if prices is None:
            if is_bf16:
                raise FxDataError(
                    f"{key}: bf16 values cannot carry prices exactly; pass prices= (float64) for {pcols}"
                )
            missing = [c for c in pcols if c not in cols]
            if missing:
                raise FxDataError(f"{key}: price columns {missing} not in columns")
            price_idx = [cols.index(c) for c in pcols]
        else:
            prices = np.asarray(prices, dtype=np.float64)
            if prices.shape != (n, len(pcols)):
                raise FxDataError(f"{key}: prices shape {prices.shape}, want {(n, len(pcols))}")
            price_idx = []

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
        prices_host = np.empty((n, len(pcols)), dtype=np.float64) if prices is None else prices
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
            if price_idx:
                prices_host[i:j] = chunk[:, price_idx]
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
        bad_px = ~np.isfinite(prices_host) | (prices_host <= 0.0)
        if bad_px.any():
            r, c = np.argwhere(bad_px)[0]
            raise FxDataError(f"{key}: price column {pcols[c]!r} not finite/positive at bar {int(r)}")
        prices_dev = torch.from_numpy(prices_host).to(dev)
        if cuda:
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0

        self._quarters[key] = _Quarter(key, dest, prices_dev, ts.copy(), cols, pcols)
        st = self._stats
        st.uploads += 1
        st.uploads_by_key[key] = st.uploads_by_key.get(key, 0) + 1
        st.bytes_uploaded += (
            n * w * (2 if wire_dtype in (torch.int16, torch.bfloat16) else 4) + prices_host.nbytes
        )
        st.upload_seconds += elapsed
        st.pinned_staging = st.pinned_staging or (cuda and bool(bufs[0].is_pinned()))
        st.chunks += n_chunks

    def drop_quarter(self, key: str) -> None:
        """Free a quarter (and any cached view that contains it)."""
        self._quarters.pop(key)
        for k in [k for k in self._views if key in k]:
            del self._views[k]

    # ------------------------------------------------------------------ fold views
    def concat_view(self, keys: Sequence[str]) -> DeviceSlice:
        """Time-ordered concatenation of the named resident quarters (built once per key set)."""
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
            if a.columns != b.columns or a.price_columns != b.price_columns:
                raise FxDataError(f"concat_view: column layout of {b.key} differs from {a.key}")
            if a.ts[-1] > b.ts[0]:
                raise FxDataError(
                    f"concat_view: {b.key} starts before {a.key} ends (keys must be in time order)"
                )
        lens = np.array([q.values.shape[0] for q in qs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        if len(qs) == 1:
            values, prices = qs[0].values, qs[0].prices  # zero copy
        else:
            values = torch.cat([q.values for q in qs], dim=0)  # device→device, once per key set
            prices = torch.cat([q.prices for q in qs], dim=0)
            self._stats.device_copy_bytes += values.numel() * values.element_size() + prices.numel() * 8
        view = DeviceSlice(
            keys=kt,
            values=values,
            prices=prices,
            ts=np.concatenate([q.ts for q in qs]),
            columns=qs[0].columns,
            price_columns=qs[0].price_columns,
            offsets=offsets,
        )
        self._stats.concat_builds += 1
        self._views[kt] = view
        while len(self._views) > self._max_views:
            self._views.popitem(last=False)
        return view
