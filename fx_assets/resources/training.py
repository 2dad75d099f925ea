"""Training resources: the fold / trainer parameters and the device-resident fxcache loader.

``DeviceFxCacheLoader`` is the "GPU IO manager": an input manager that loads each quarter's
fxcache onto the device **once per run** (pinned, chunked host→device copies through
:class:`fx_assets.core.device_store.DeviceStore`) and hands the training assets a
:class:`ResidentQuarters` handle they slice by index per fold. Its state lives for one run in
one process, so the training job runs with the in-process executor: every fold asset of the
run sees the same store and no quarter crosses the bus twice. Without CUDA the same code runs
on the CPU.

When a fold does not fit in device memory (``device_memory_budget_gib``, default: the device's
free memory minus a margin), its quarters are not uploaded: the fold is trained from blocks
streamed from its fxcache files (:class:`fx_assets.core.fold_stream.StreamedRows`), decided
per fold by :meth:`ResidentQuarters.plan`.
"""

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dagster as dg
from pydantic import Field, PrivateAttr

from fx_assets.assets.common import StageIO
from fx_assets.core import lineage
from fx_assets.core.configmodel import ConfigModel, ValidatedCopy
from fx_assets.core.device_store import ValueDtype
from fx_assets.core.folds import FoldConfig
from fx_assets.core.fxcache import read_header
from fx_assets.core.trainers.common import TrainConfig, TrainParams
from fx_assets.partitions import QuarterSymbol, parse_partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage

if TYPE_CHECKING:  # torch-backed: imported where a training step uses them
    from fx_assets.core.device_store import DeviceSlice, DeviceStore
    from fx_assets.core.fold_stream import StreamedRows


class FoldsConfig(dg.Config, FoldConfig):
    """Walk-forward folds: rolling window, purge, embargo, warm-up (bars).

    Every field has a default, so a run config may set only what it changes (Dagster builds the
    resource from the run config alone, not on top of the definitions' instance)."""

    train_quarters: int | None = Field(  # type: ignore[assignment]
        default=None,
        ge=1,
        description="Rolling training window (quarters before the validation quarter). None: the "
        "project's train_quarters (FX_TRAIN_QUARTERS), which also fixes each fold's fxcache "
        "dependencies; any other value must equal it.",
    )
    purge_bars: int = Field(
        default=31,
        ge=0,
        description="Training bars dropped before validation start; must be >= the longest label "
        "horizon (labels.max_horizon(), 31 bars with the default horizons).",
    )
    warmup_bars: int = Field(
        default=0, ge=0, description="Bars excluded at the start of the concatenation (feature warm-up)."
    )


class TrainerConfig(dg.Config, TrainParams):
    """Trainer selection and hyper-parameters."""

    trainer: Literal["mlp", "dqn"] = Field(
        default="mlp", description="Which trainer: supervised MLP or double DQN."
    )


class TrainingConfig(ValidatedCopy, dg.ConfigurableResource):
    """Parameters of the training stages; every field is part of the model cache keys."""

    folds: FoldsConfig = Field(default_factory=FoldsConfig, description="Walk-forward fold construction.")
    train: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer and hyper-parameters.")

    def fold_config(self, train_quarters: int) -> FoldConfig:
        """The core fold config, with the project's window (``train_quarters``) filled in."""
        n = self.folds.train_quarters
        if n is not None and n != train_quarters:
            raise dg.Failure(
                f"training.folds.train_quarters={n} differs from the project's train_quarters="
                f"{train_quarters} (FX_TRAIN_QUARTERS), which fixes each fold's fxcache inputs: "
                "change the project setting instead"
            )
        return FoldConfig.model_validate({**self.folds.model_dump(), "train_quarters": train_quarters})

    def train_config(self, row_unit: str = "bar") -> TrainConfig:
        """The core trainer config for folds of ``row_unit`` rows (the pipeline's
        ``fxcache.row_unit``: it decides the labels and their purge)."""
        return TrainConfig.model_validate({**self.train.model_dump(), "row_unit": row_unit})


def default_training(train_quarters: int) -> TrainingConfig:
    """The definitions' training resource: the field defaults, the project's window shown."""
    return TrainingConfig(folds=FoldsConfig(train_quarters=train_quarters))


@dataclass
class FoldPlan:
    """How a fold is trained: ``resident`` (its quarters on the device) or ``stream``."""

    mode: str
    need_bytes: int  # the resident fold's device bytes (core.fold_stream.fold_device_bytes)
    budget_bytes: int


@dataclass
class ResidentQuarters:
    """The quarters an input loaded, resident on the device, by partition label; and the
    fxcache files of every requested partition, for folds that stream."""

    store: "DeviceStore"
    loader: "DeviceFxCacheLoader"  # the loader that uploaded them (its settings key the models)
    keys: dict[str, str] = field(default_factory=dict)  # "2024-Q1|ES.FUT" -> store key (cache key)
    paths: dict[str, Path] = field(default_factory=dict)  # "2024-Q1|ES.FUT" -> fxcache file

    def view(self, parts: list[QuarterSymbol]) -> "DeviceSlice":
        """The fold's resident slice (its quarters uploaded now if the input did not)."""
        if any(p.label not in self.keys and p.label in self.paths for p in parts):
            # quarters deferred by the input: this fold's go up together (one allocation, so
            # the view is a slice), replacing whatever an earlier fold left on the device
            self.keys = self.loader.load_quarters(parts, replace=True)
        missing = [p.label for p in parts if p.label not in self.keys]
        if missing:
            raise dg.Failure(
                f"fxcache of {', '.join(missing)} not loaded (materialize fxcache for them first)"
            )
        return self.store.concat_view([self.keys[p.label] for p in parts])

    def changed_since_loaded(self, parts: list[QuarterSymbol]) -> list[str]:
        """Those of ``parts`` whose fxcache for today's sources and config is no longer the file
        this input resolved (their raw data changed since): "label (now <file or why>)"."""
        out = []
        for p in parts:
            if p.label not in self.paths:
                continue
            now = StageIO(self.loader.storage, self.loader.pipeline, p).current_name("fxcache")
            if now != self.paths[p.label].name:
                out.append(f"{p.label} (now {now})")
        return out

    def plan(self, parts: list[QuarterSymbol]) -> FoldPlan:
        """Resident when the fold's quarters (and its transition's outputs) fit the loader's
        device-memory budget, else streamed."""
        from fx_assets.core.fold_stream import plan_fold

        need = self.loader.fold_bytes([self.paths[p.label] for p in parts])
        budget = self.loader.budget_bytes()
        return FoldPlan(plan_fold(need, budget), need, budget)

    def streamed(self, parts: list[QuarterSymbol], fold_range: Any, cfg: TrainConfig) -> "StreamedRows":
        """The fold's rows streamed from its fxcache files, in blocks of ``cfg.block_rows`` (or
        the loader's ``stream_block_rows``)."""
        from fx_assets.core.fold_stream import StreamedRows

        return StreamedRows(
            [self.paths[p.label] for p in parts],
            fold_range,
            cfg,
            block_rows=cfg.block_rows or self.loader.stream_block_rows,
            device=self.store.device,
            keys=[read_header(self.paths[p.label]).cache_key.hex() for p in parts],
            price_tick=self.loader.pipeline.stage_configs().ofi.tick_size,
        )


#: Loader fields that cannot change a trained model, left out of its key (the completeness test
#: checks every other field moves the key): ``storage`` only says where the files are (their
#: contents are keyed), and ``pipeline``'s stage configs reach the key through the fxcache keys.
MODEL_KEY_EXCLUDED = frozenset({"storage", "pipeline"})


class DeviceFxCacheLoader(dg.ConfigurableIOManager, ConfigModel):
    """Loads fxcache partitions onto the device once per run; returns ResidentQuarters."""

    storage: dg.ResourceDependency[FxStorage]
    pipeline: dg.ResourceDependency[PipelineConfig]
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="'auto' (cuda if available, else cpu), 'cpu' or 'cuda[:N]'.",
    )
    value_dtype: ValueDtype = Field(
        default="float32", description="Dtype of the resident values: float32 or bfloat16."
    )
    chunk_rows: int = Field(
        default=65536, ge=1024, description="Rows per pinned staging chunk (bounds host memory)."
    )
    device_memory_budget_gib: float | None = Field(
        default=None,
        gt=0,
        description="Device memory (GiB) a fold may take resident: its quarters, its inputs and "
        "labels and the trainer's buffers (core.fold_stream.fold_device_bytes). A fold above it "
        "is streamed from its fxcache files instead. None: the device's free memory when the "
        "run starts minus 10 % (at least 2 GiB).",
    )
    stream_block_rows: int = Field(
        default=1 << 20,
        ge=1024,
        description="Rows per block of a streamed fold when the trainer's block_rows is None "
        "(each block crosses the bus once per pass; two pinned host and two device buffers).",
    )

    _store: "DeviceStore | None" = PrivateAttr(default=None)
    _loaded: dict[str, str] = PrivateAttr(default_factory=dict)
    _budget: int | None = PrivateAttr(default=None)

    def store(self) -> "DeviceStore":
        from fx_assets.core.device_store import DeviceStore

        if self._store is None:
            self._store = DeviceStore(
                device=None if self.device == "auto" else self.device,
                value_dtype=self.value_dtype,
                chunk_rows=self.chunk_rows,
                max_views=4,
                # trade prices must be exact: on the tick grid, never of a coarser resolution
                price_tick=self.pipeline.stage_configs().ofi.tick_size,
            )
        return self._store

    def device_kind(self) -> str:
        """The kind of device the data goes to (``cuda`` / ``cpu``), "auto" resolved."""
        import torch

        from fx_assets.core.device_store import default_device

        if self._store is not None:
            return self._store.device.type
        return default_device().type if self.device == "auto" else torch.device(self.device).type

    def key_settings(self) -> dict[str, Any]:
        """What the trained model's key records of this loader: every field but those in
        ``MODEL_KEY_EXCLUDED``, and the resolved device kind (cpu and cuda numerics differ)."""
        return {**lineage.resource_settings(self, MODEL_KEY_EXCLUDED), "device_kind": self.device_kind()}

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        raise NotImplementedError("DeviceFxCacheLoader only loads inputs; fxcache writes its own files")

    def budget_bytes(self) -> int:
        """The device-memory budget in bytes (the setting, or free memory minus a margin,
        resolved once per run)."""
        from fx_assets.core.fold_stream import default_budget_bytes

        if self.device_memory_budget_gib is not None:
            return int(self.device_memory_budget_gib * (1 << 30))
        if self._budget is None:
            self._budget = default_budget_bytes(self.store().device)
        return self._budget

    def fold_bytes(self, paths: list[Path]) -> int:
        """Device bytes of a resident fold over these fxcache files (from their headers)."""
        from fx_assets.core.fold_stream import fold_device_bytes

        hs = [read_header(p) for p in paths]
        n = sum(int(h.n_bars) for h in hs)
        h = hs[0]
        itemsize = self.store().value_dtype.itemsize
        return fold_device_bytes(n, int(h.row_width), itemsize, int(h.price_width), int(h.n_values))

    def load_quarters(self, parts: list[QuarterSymbol], replace: bool = False) -> dict[str, str]:
        """Upload the partitions' fxcache files this run has not uploaded yet, in one threaded
        read → pinned buffer → device pipeline (each file validated first). Each symbol's
        quarters go in time order, so the store lays them back to back and a fold's view of
        consecutive quarters is a slice, not a copy. ``replace`` (folds uploaded one at a time):
        every quarter on the device is dropped first. Returns label -> store key of what is
        uploaded."""
        if replace:
            for label in list(self._loaded):
                self.store().drop_quarter(self._loaded.pop(label))
        todo = sorted((p for p in parts if p.label not in self._loaded), key=lambda p: (p.symbol, p.quarter))
        if not todo:
            return dict(self._loaded)
        items = []
        for part in todo:
            path = StageIO(self.storage, self.pipeline, part).require("fxcache")
            # the store key is the file's cache key (header only here; the store verifies the
            # checksums of every byte and takes the prices from the file's f64 price block)
            key = read_header(path).cache_key.hex()
            items.append((key, path))
            self._loaded[part.label] = key
        try:
            self.store().add_fxcaches(items)
        except Exception:
            for part in todo:
                self._loaded.pop(part.label, None)
            raise
        return dict(self._loaded)

    def load_input(self, context: dg.InputContext) -> ResidentQuarters:
        keys = context.asset_partition_keys if context.has_asset_partitions else []
        t0 = time.perf_counter()
        before = int(self.store().stats()["uploads"])
        parts = [parse_partition_key(k) for k in sorted(keys, key=str)]
        paths = {p.label: StageIO(self.storage, self.pipeline, p).require("fxcache") for p in parts}
        need = self.fold_bytes(list(paths.values())) if paths else 0
        budget = self.budget_bytes()
        if need <= budget:  # every requested quarter fits at once: upload them all now
            self.load_quarters(parts)
            how = "uploaded now"
        else:  # each fold decides: resident folds upload their quarters when they run
            how = f"deferred to the folds (all would need {need / 2**30:.2f} GiB > budget {budget / 2**30:.2f} GiB)"
        stats = self.store().stats()
        context.log.info(
            f"fxcache loader: {len(keys)} partition(s) requested, {stats['uploads'] - before} {how}, "
            f"{stats['uploads']} uploads this run on {self.store().device} in {time.perf_counter() - t0:.3f}s"
        )
        return ResidentQuarters(self.store(), self, dict(self._loaded), paths)


def quarter_window(val_quarter: dt.date, n_train: int) -> list[dt.date]:
    """The fold's quarters, oldest first: n_train training quarters then the validation quarter."""
    from fx_assets.core.calendar import previous_quarter

    out = [val_quarter]
    for _ in range(n_train):
        out.insert(0, previous_quarter(out[0]))
    return out
