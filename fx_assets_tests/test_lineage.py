"""Cache keys are complete: every field of every stage config, every source identity, the format
and code versions move the key of everything downstream (DESIGN.md §5.3)."""

import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from pydantic import BaseModel

from fx_assets.core import lineage
from fx_assets.core.bar_features import BarFeatureConfig, max_window
from fx_assets.core.bars import BarConfig
from fx_assets.core.cachekey import (
    SourceIdentity,
    config_fields,
    field_info_at,
    get_field,
    mutate_field_value,
    replace_field,
)
from fx_assets.core.folds import FoldConfig
from fx_assets.core.lineage import FxCacheConfig, StageConfigs
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.trainers.common import TrainConfig

Q = dt.date(2024, 7, 1)


def lookup_factory(overrides: dict | None = None):
    overrides = overrides or {}

    def lookup(schema: str, quarter: dt.date) -> SourceIdentity | None:
        base = SourceIdentity(f"/data/raw/{schema}/ES.FUT_{quarter}.dbn.zst", 1000, "xxh3-128:" + "ab" * 16)
        return overrides.get((schema, quarter), base)

    return lookup


def stages() -> StageConfigs:
    return StageConfigs(BarConfig(), BarFeatureConfig(), OfiConfig(), FxCacheConfig())


def mutations(model: BaseModel):
    """(field path, changed model) for every leaf field of the model, found by introspection."""
    for path in config_fields(type(model)):
        info = field_info_at(type(model), path)
        for value in mutate_field_value(get_field(model, path), info):
            try:
                yield path, replace_field(model, path, value)
                break
            except ValueError:
                continue
        else:
            pytest.fail(f"no valid mutation for {type(model).__name__}.{path}")


def many_bars(quarter: dt.date) -> int:
    """Bar count of every quarter: more than any warm-up needs."""
    return 10**6


STAGE_KEYS = {
    "roll_calendar": lambda cfg, lookup, q, n: lineage.roll_calendar_key(lookup, q),
    "bars": lambda cfg, lookup, q, n: lineage.bars_key(cfg, lookup, q),
    "bar_features": lambda cfg, lookup, q, n: lineage.bar_features_key(cfg, lookup, q, n),
    "ofi_features": lambda cfg, lookup, q, n: lineage.ofi_features_key(cfg, lookup, q),
    "fxcache": lambda cfg, lookup, q, n: lineage.fxcache_key(cfg, lookup, q, n),
}


def all_keys(cfg: StageConfigs, lookup, q: dt.date = Q, bar_count=many_bars) -> dict[str, str]:
    return {name: fn(cfg, lookup, q, bar_count) for name, fn in STAGE_KEYS.items()}


@pytest.mark.parametrize("stage", ["bars", "bar_features", "ofi", "fxcache", "snapshot"])
def test_every_feature_stage_field_moves_the_fxcache_key(stage: str) -> None:
    lookup = lookup_factory()
    base = stages()
    k0 = lineage.fxcache_key(base, lookup, Q, many_bars)
    seen = 0
    for path, changed in mutations(getattr(base, stage)):
        cfg = dataclasses.replace(base, **{stage: changed})
        assert lineage.fxcache_key(cfg, lookup, Q, many_bars) != k0, (
            f"{stage}.{path} is not in the fxcache key"
        )
        seen += 1
    assert seen == len(config_fields(type(getattr(base, stage))))


def test_upstream_fields_move_intermediate_keys() -> None:
    lookup = lookup_factory()
    base = stages()
    k0 = all_keys(base, lookup)
    for path, changed in mutations(base.bars):
        k1 = all_keys(dataclasses.replace(base, bars=changed), lookup)
        for name in ("bars", "bar_features", "ofi_features", "fxcache"):
            assert k1[name] != k0[name], f"bars.{path} missing from the {name} key"
        assert k1["roll_calendar"] == k0["roll_calendar"]


FOLDS = FoldConfig(train_quarters=2, purge_bars=31, warmup_bars=0)
TRAIN = TrainConfig(trainer="mlp")
LOADER = {"resource": "loader", "fields": {"value_dtype": "float32"}, "device_kind": "cpu"}


def model_key(keys=("k1", "k2", "k3"), folds=FOLDS, train=TRAIN, loader=LOADER) -> str:
    return lineage.trained_model_key(list(keys), folds, train, loader, label_horizon=train.purge_bars)


@pytest.mark.parametrize("model_cls", [FoldConfig, TrainConfig])
def test_every_training_field_moves_the_model_key(model_cls: type[BaseModel]) -> None:
    k0 = model_key()
    base = FOLDS if model_cls is FoldConfig else TRAIN
    for path, changed in mutations(base):
        f, t = (changed, TRAIN) if model_cls is FoldConfig else (FOLDS, changed)
        assert model_key(folds=f, train=t) != k0, f"{model_cls.__name__}.{path} not in the model key"
    assert model_key(keys=["k1", "k2", "kX"]) != k0


def test_fold_ranges_key_covers_the_label_horizon() -> None:
    """fold_ranges purges by the trainer's label reach: a longer horizon is another file."""
    k0 = lineage.fold_ranges_key(["k1", "k2"], FOLDS, TRAIN.purge_bars)
    longer = TrainConfig(trainer="mlp", horizons=[1, 5, 60])
    assert lineage.fold_ranges_key(["k1", "k2"], FOLDS, longer.purge_bars) != k0


def _loader(tmp_path: Path, **fields):
    from fx_assets.resources.pipeline import PipelineConfig
    from fx_assets.resources.storage import FxStorage
    from fx_assets.resources.training import DeviceFxCacheLoader

    return DeviceFxCacheLoader(storage=FxStorage(root=str(tmp_path)), pipeline=PipelineConfig(), **fields)


def _asset_model_key(tmp_path: Path, loader, training=None) -> str:
    """The model key exactly as the trained_model asset computes it (model_dir)."""
    from fx_assets.assets import training as training_assets
    from fx_assets.partitions import QuarterSymbol
    from fx_assets.resources.training import default_training

    class FakeIO:  # the fxcache keys of the fold's quarters, without raw files on disk
        def __init__(self, storage, pipeline, part) -> None:
            self.part = part

        def key(self, stage: str) -> str:
            return f"fxcache-{self.part.label}"

    cfg = training or default_training(2)
    mp = pytest.MonkeyPatch()
    mp.setattr(training_assets, "StageIO", FakeIO)
    try:
        _, key, _ = training_assets.model_dir(
            loader.storage,
            loader.pipeline,
            cfg,
            loader,
            QuarterSymbol(Q, "ES.FUT"),
            cfg.folds.train_quarters or 2,  # the project's fold window follows the config here
        )
    finally:
        mp.undo()
    return key


def test_loader_value_dtype_is_in_the_model_key(tmp_path: Path) -> None:
    """Issue 8.1: a float32 model must not be 'reused' for a bfloat16 request."""
    k32 = _asset_model_key(tmp_path, _loader(tmp_path, value_dtype="float32"))
    k16 = _asset_model_key(tmp_path, _loader(tmp_path, value_dtype="bfloat16"))
    assert k32 != k16


ALTERNATIVES = {"device": ["cpu", "cuda:1"]}


def test_every_loader_field_moves_the_model_key(tmp_path: Path) -> None:
    """Every field of the device loader is in the model key, found by introspection; only the
    documented exclusions are left out, and they must name real fields."""
    from fx_assets.resources.training import MODEL_KEY_EXCLUDED, DeviceFxCacheLoader

    fields = DeviceFxCacheLoader.model_fields
    assert MODEL_KEY_EXCLUDED <= set(fields), "an exclusion names no field"
    base = _loader(tmp_path)
    k0 = _asset_model_key(tmp_path, base)
    checked = []
    for name, info in fields.items():
        if name in MODEL_KEY_EXCLUDED:
            continue
        # a field with a pattern takes values the generic mutation cannot guess
        for value in [*ALTERNATIVES.get(name, []), *mutate_field_value(getattr(base, name), info)]:
            try:
                changed = _loader(
                    tmp_path,
                    **{**{n: getattr(base, n) for n in fields if n not in MODEL_KEY_EXCLUDED}, name: value},
                )
            except ValueError:
                continue
            break
        else:
            pytest.fail(f"no valid mutation for DeviceFxCacheLoader.{name}")
        assert _asset_model_key(tmp_path, changed) != k0, (
            f"DeviceFxCacheLoader.{name} is not in the model key"
        )
        checked.append(name)
    assert {"value_dtype", "device"} <= set(checked)


def test_loader_key_records_the_resolved_device_kind(tmp_path: Path) -> None:
    """'auto' is cuda on one machine and cpu on another: the key holds what it resolved to."""
    import torch

    settings = _loader(tmp_path).key_settings()
    assert settings["device_kind"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert _loader(tmp_path, device="cpu").key_settings()["device_kind"] == "cpu"
    with pytest.raises(ValueError, match="do not exist"):
        lineage.resource_settings(_loader(tmp_path), ["no_such_field"])


@pytest.mark.parametrize("schema", ["trades", "mbp-10"])
@pytest.mark.parametrize("field", ["path", "size", "content_hash"])
def test_source_identity_moves_the_key(schema: str, field: str) -> None:
    base = stages()
    k0 = lineage.fxcache_key(base, lookup_factory(), Q, many_bars)
    ident = lookup_factory()(schema, Q)
    assert ident is not None
    changed = dataclasses.replace(
        ident, **{field: getattr(ident, field) * 2 if field != "path" else "/elsewhere"}
    )
    assert lineage.fxcache_key(base, lookup_factory({(schema, Q): changed}), Q, many_bars) != k0


def _replaced(schema: str, quarter: dt.date):
    ident = lookup_factory()(schema, quarter)
    assert ident is not None
    return lookup_factory({(schema, quarter): dataclasses.replace(ident, size=1)})


def test_warmup_quarter_sources_are_in_the_feature_keys() -> None:
    """Features of 2024-Q3 start from 2024-Q2's bars: replacing Q2's trades must move the key."""
    base = stages()
    k0 = all_keys(base, lookup_factory())
    k1 = all_keys(base, _replaced("trades", Q2))
    for name in ("bar_features", "ofi_features", "fxcache"):
        assert k1[name] != k0[name], name


Q2, Q1, Q0 = dt.date(2024, 4, 1), dt.date(2024, 1, 1), dt.date(2023, 10, 1)


def test_short_previous_quarter_extends_the_warmup_and_the_key() -> None:
    """Issue 8.3: when 2024-Q2 holds fewer bars than the features' max_window, the warm-up
    reads 2024-Q1's bars too (built with 2023-Q4's trades for their roll calendar), and the key
    covers exactly those files: 2023-Q4's trades move it then, and only then."""
    base = stages()
    need = max_window(base.bar_features)

    def short_q2(q: dt.date) -> int:
        return need // 3 if q == Q2 else 10**6

    assert lineage.bar_features_warmup(base, lookup_factory(), many_bars, Q) == (Q2,)
    assert lineage.bar_features_warmup(base, lookup_factory(), short_q2, Q) == (Q1, Q2)
    for bar_count, reaches_q0 in ((many_bars, False), (short_q2, True)):
        k0 = all_keys(base, lookup_factory(), bar_count=bar_count)
        k1 = all_keys(base, _replaced("trades", Q0), bar_count=bar_count)
        assert (k1["bar_features"] != k0["bar_features"]) is reaches_q0
        assert (k1["fxcache"] != k0["fxcache"]) is reaches_q0
        assert k1["bars"] == k0["bars"] and k1["ofi_features"] == k0["ofi_features"]
        # one quarter further back is never read
        far = dt.date(2023, 7, 1)
        assert all_keys(base, _replaced("trades", far), bar_count=bar_count) == k0
    # the walk stops at the first quarter without raw trades
    no_q1 = lookup_factory({("trades", Q1): None})
    assert lineage.bar_features_warmup(base, no_q1, short_q2, Q) == (Q2,)


def test_ofi_warmup_needs_both_previous_files() -> None:
    """OFI replays 2024-Q2's tail only when Q2 has trades and book; its key lists Q2's files
    (and Q2's bars, whose roll calendar read 2024-Q1's trades) exactly then."""
    base = stages()
    assert lineage.ofi_warmup_quarter(lookup_factory(), Q) == Q2
    no_book = {("mbp-10", Q2): None}
    assert lineage.ofi_warmup_quarter(lookup_factory(no_book), Q) is None
    q1 = lookup_factory()("trades", Q1)
    assert q1 is not None
    other_q1 = {("trades", Q1): dataclasses.replace(q1, size=1)}
    assert lineage.ofi_features_key(base, lookup_factory(other_q1), Q) != lineage.ofi_features_key(
        base, lookup_factory(), Q
    )
    assert lineage.ofi_features_key(
        base, lookup_factory({**no_book, **other_q1}), Q
    ) == lineage.ofi_features_key(base, lookup_factory(no_book), Q)


def test_format_and_code_versions_move_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from fx_assets.core import codeversion

    base = stages()
    k0 = all_keys(base, lookup_factory())
    real = codeversion.stage_version
    monkeypatch.setattr(codeversion, "stage_version", lambda s: "0" * 16 if s == "bars" else real(s))
    k1 = all_keys(base, lookup_factory())
    assert k1["roll_calendar"] == k0["roll_calendar"]
    for name in ("bars", "bar_features", "ofi_features", "fxcache"):
        assert k1[name] != k0[name], name
    monkeypatch.undo()
    from fx_assets.core import fxcache

    monkeypatch.setattr(fxcache, "FORMAT_VERSION", fxcache.FORMAT_VERSION + 1)
    assert lineage.fxcache_key(base, lookup_factory(), Q, many_bars) != k0["fxcache"]


def test_dagster_config_subclass_gives_the_core_key(tmp_path: Path) -> None:
    """Keys are computed from the core models, so the CLI and the Dagster resource agree."""
    from fx_assets.resources.pipeline import BarsConfig, PipelineConfig

    p = PipelineConfig(bars=BarsConfig(volume_bar_size=250))
    lookup = lookup_factory()
    assert lineage.fxcache_key(p.stage_configs(), lookup, Q, many_bars) == lineage.fxcache_key(
        dataclasses.replace(stages(), bars=BarConfig(volume_bar_size=250)), lookup, Q, many_bars
    )


def test_every_training_resource_field_moves_the_model_key(tmp_path: Path) -> None:
    """Every leaf field of the training resource, found by introspection, reaches the model key
    through model_dir (a field added to the resource itself is covered too)."""
    from fx_assets.resources.training import TrainingConfig, default_training

    base = default_training(2)
    loader = _loader(tmp_path)
    k0 = _asset_model_key(tmp_path, loader, base)
    paths = config_fields(TrainingConfig)
    assert "train.lr" in paths and "folds.purge_bars" in paths
    for path in paths:
        info = field_info_at(TrainingConfig, path)
        for value in mutate_field_value(get_field(base, path), info):
            try:
                changed = replace_field(base, path, value)
                _asset_model_key(tmp_path, loader, changed)
            except ValueError:
                continue
            break
        else:
            pytest.fail(f"no valid mutation for TrainingConfig.{path}")
        assert _asset_model_key(tmp_path, loader, changed) != k0, (
            f"TrainingConfig.{path} is not in the model key"
        )


def test_every_pipeline_resource_field_reaches_the_keys() -> None:
    """Every leaf field of the pipeline resource moves the fxcache key, except the documented
    ones that change no output (``PIPELINE_KEY_EXCLUDED``, which must name real fields)."""
    from fx_assets.resources.pipeline import PIPELINE_KEY_EXCLUDED, PipelineConfig

    assert PIPELINE_KEY_EXCLUDED <= set(PipelineConfig.model_fields)
    base = PipelineConfig()
    lookup = lookup_factory()
    k0 = lineage.fxcache_key(base.stage_configs(), lookup, Q, many_bars)
    checked = 0
    for path in config_fields(PipelineConfig):
        if path.split(".")[0] in PIPELINE_KEY_EXCLUDED:
            continue
        info = field_info_at(PipelineConfig, path)
        for value in mutate_field_value(get_field(base, path), info):
            try:
                changed = replace_field(base, path, value)
            except ValueError:
                continue
            break
        else:
            pytest.fail(f"no valid mutation for PipelineConfig.{path}")
        k1 = lineage.fxcache_key(changed.stage_configs(), lookup, Q, many_bars)  # type: ignore[attr-defined]
        assert k1 != k0, f"PipelineConfig.{path} is not in the fxcache key"
        checked += 1
    assert checked == sum(
        len(config_fields(type(getattr(base.stage_configs(), f.name))))
        for f in dataclasses.fields(StageConfigs)
    )


def test_the_row_unit_reaches_every_downstream_key() -> None:
    """``fxcache.row_unit`` is in the fxcache key, and through it in the fold and model keys."""
    lookup = lookup_factory()
    base = stages()
    snap = dataclasses.replace(base, fxcache=FxCacheConfig(row_unit="snapshot"))
    k_bar, k_snap = (lineage.fxcache_key(c, lookup, Q, many_bars) for c in (base, snap))
    assert k_bar != k_snap
    assert lineage.fold_ranges_key([k_bar], FOLDS, 31) != lineage.fold_ranges_key([k_snap], FOLDS, 31)
    assert model_key(keys=[k_bar]) != model_key(keys=[k_snap])
    # the snapshot stack's parameters are keyed whatever the row unit
    from fx_assets.core.snapshot_features import SnapshotFeatureConfig

    other = dataclasses.replace(snap, snapshot=SnapshotFeatureConfig(rate_window=7))
    assert lineage.fxcache_key(other, lookup, Q, many_bars) != k_snap
