"""Training resources: the fold / trainer parameters and the device-resident fxcache loader.

``DeviceFxCacheLoader`` is the "GPU IO manager": an input manager that loads each quarter's
fxcache onto the device **once per run** (pinned, chunked host→device copies through
:class:`fx_assets.core.device_store.DeviceStore`) and hands the training assets a
:class:`ResidentQuarters` handle they slice by index per fold. Its state lives for one run in
one process, so the training job runs with the in-process executor: every fold asset of the
run sees the same store and no quarter crosses the bus twice. Without CUDA the same code runs
on the CPU.
"""

import datetime as dt
import time
from dataclasses import dataclass, field

import dagster as dg
from pydantic import Field, PrivateAttr

from fx_assets.assets.common import StageIO
from fx_assets.core.device_store import DeviceSlice, DeviceStore
from fx_assets.core.folds import FoldConfig
from fx_assets.core.fxcache import open_fxcache
from fx_assets.core.trainers.common import TrainConfig
from fx_assets.partitions import QuarterSymbol, parse_partition_key
from fx_assets.resources.pipeline import PipelineConfig
from fx_assets.resources.storage import FxStorage


class FoldsConfig(dg.Config, FoldConfig):
    """Walk-forward folds: rolling window, purge, embargo, warm-up (bars)."""


class TrainerConfig(dg.Config, TrainConfig):
    """Trainer selection and hyper-parameters."""


class TrainingConfig(dg.ConfigurableResource):
    """Parameters of the training stages; every field is part of the model cache keys."""

    folds: FoldsConfig = Field(description="Walk-forward fold construction.")
    train: TrainerConfig = Field(description="Trainer and hyper-parameters.")

    def fold_config(self) -> FoldConfig:
        return FoldConfig.model_validate(self.folds.model_dump())

    def train_config(self) -> TrainConfig:
        return TrainConfig.model_validate(self.train.model_dump())


def default_training(train_quarters: int) -> TrainingConfig:
    return TrainingConfig(
        folds=FoldsConfig(
            train_quarters=train_quarters, purge_bars=31, warmup_bars=0
        ),  # embargo: reference default
        train=TrainerConfig(trainer="mlp"),
    )


@dataclass
class ResidentQuarters:
    """The quarters an input loaded, resident on the device, by partition label."""

    store: DeviceStore
    keys: dict[str, str] = field(default_factory=dict)  # "2024-Q1|ES.FUT" -> store key (cache key)

    def view(self, parts: list[QuarterSymbol]) -> DeviceSlice:
        missing = [p.label for p in parts if p.label not in self.keys]
        if missing:
            raise dg.Failure(
                f"fxcache of {', '.join(missing)} not loaded (materialize fxcache for them first)"
            )
        return self.store.concat_view([self.keys[p.label] for p in parts])


class DeviceFxCacheLoader(dg.ConfigurableIOManager):
    """Loads fxcache partitions onto the device once per run; returns ResidentQuarters."""

    storage: dg.ResourceDependency[FxStorage]
    pipeline: dg.ResourceDependency[PipelineConfig]
    device: str = Field(
        default="auto", description="'auto' (cuda if available, else cpu), 'cpu' or 'cuda[:N]'."
    )
    value_dtype: str = Field(
        default="float32", description="Dtype of the resident values: float32 or bfloat16."
    )
    chunk_rows: int = Field(
        default=65536, ge=1024, description="Rows per pinned staging chunk (bounds host memory)."
    )

    _store: DeviceStore | None = PrivateAttr(default=None)
    _loaded: dict[str, str] = PrivateAttr(default_factory=dict)

    def store(self) -> DeviceStore:
        if self._store is None:
            self._store = DeviceStore(
                device=None if self.device == "auto" else self.device,
                value_dtype=self.value_dtype,  # type: ignore[arg-type]
                chunk_rows=self.chunk_rows,
                max_views=4,
            )
        return self._store

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        raise NotImplementedError("DeviceFxCacheLoader only loads inputs; fxcache writes its own files")

    def load_quarters(self, parts: list[QuarterSymbol]) -> None:
        """Upload the partitions' fxcache files this run has not uploaded yet, in one threaded
        read → pinned buffer → device pipeline (each file validated first)."""
        todo = [p for p in parts if p.label not in self._loaded]
        if not todo:
            return
        items, prices = [], []
        for part in todo:
            path = StageIO(self.storage, self.pipeline, part).require("fxcache")
            cache = open_fxcache(path, verify_finite=False)  # the device checks the values
            key = cache.cache_key.hex()
            # bf16 cannot carry prices (8 significant bits): those come decoded from the file.
            prices.append(cache.decoded(slice(None), cache.group("price")) if cache.dtype == "bf16" else None)
            items.append((key, path))
            self._loaded[part.label] = key
        try:
            self.store().add_fxcaches(items, prices=prices)
        except Exception:
            for part in todo:
                self._loaded.pop(part.label, None)
            raise

    def load_input(self, context: dg.InputContext) -> ResidentQuarters:
        keys = context.asset_partition_keys if context.has_asset_partitions else []
        t0 = time.perf_counter()
        before = int(self.store().stats()["uploads"])
        self.load_quarters([parse_partition_key(k) for k in sorted(keys, key=str)])
        stats = self.store().stats()
        context.log.info(
            f"fxcache loader: {len(keys)} partition(s) requested, {stats['uploads'] - before} uploaded now, "
            f"{stats['uploads']} uploads this run on {self.store().device} in {time.perf_counter() - t0:.3f}s"
        )
        return ResidentQuarters(self.store(), dict(self._loaded))


def quarter_window(val_quarter: dt.date, n_train: int) -> list[dt.date]:
    """The fold's quarters, oldest first: n_train training quarters then the validation quarter."""
    from fx_assets.core.calendar import previous_quarter

    out = [val_quarter]
    for _ in range(n_train):
        out.insert(0, previous_quarter(out[0]))
    return out
