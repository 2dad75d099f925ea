"""Cache keys are complete: every field of every stage config, every source identity, the format
and code versions move the key of everything downstream (DESIGN.md §5.3)."""

import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from pydantic import BaseModel

from fx_assets.core import lineage
from fx_assets.core.bar_features import BarFeatureConfig
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


@pytest.mark.parametrize("stage", ["bars", "bar_features", "ofi", "fxcache"])
def test_every_feature_stage_field_moves_the_fxcache_key(stage: str) -> None:
    lookup = lookup_factory()
    base = stages()
    k0 = lineage.fxcache_key(base, lookup, Q)
    seen = 0
    for path, changed in mutations(getattr(base, stage)):
        cfg = dataclasses.replace(base, **{stage: changed})
        assert lineage.fxcache_key(cfg, lookup, Q) != k0, f"{stage}.{path} is not in the fxcache key"
        seen += 1
    assert seen == len(config_fields(type(getattr(base, stage))))


def test_upstream_fields_move_intermediate_keys() -> None:
    lookup = lookup_factory()
    base = stages()
    for path, changed in mutations(base.bars):
        cfg = dataclasses.replace(base, bars=changed)
        for fn in (lineage.bars_key, lineage.bar_features_key, lineage.ofi_features_key):
            assert fn(cfg, lookup, Q) != fn(base, lookup, Q), f"bars.{path} missing from {fn.__name__}"


@pytest.mark.parametrize("model_cls", [FoldConfig, TrainConfig])
def test_every_training_field_moves_the_model_key(model_cls: type[BaseModel]) -> None:
    folds = FoldConfig(train_quarters=2, purge_bars=31, warmup_bars=0)
    train = TrainConfig(trainer="mlp")
    keys = ["k1", "k2", "k3"]
    k0 = lineage.trained_model_key(keys, folds, train)
    base = folds if model_cls is FoldConfig else train
    for path, changed in mutations(base):
        f, t = (changed, train) if model_cls is FoldConfig else (folds, changed)
        assert lineage.trained_model_key(keys, f, t) != k0, (
            f"{model_cls.__name__}.{path} not in the model key"
        )
    assert lineage.trained_model_key(["k1", "k2", "kX"], folds, train) != k0


@pytest.mark.parametrize("schema", ["trades", "mbp-10"])
@pytest.mark.parametrize("field", ["path", "size", "content_hash"])
def test_source_identity_moves_the_key(schema: str, field: str) -> None:
    base = stages()
    k0 = lineage.fxcache_key(base, lookup_factory(), Q)
    ident = lookup_factory()(schema, Q)
    assert ident is not None
    changed = dataclasses.replace(
        ident, **{field: getattr(ident, field) * 2 if field != "path" else "/elsewhere"}
    )
    assert lineage.fxcache_key(base, lookup_factory({(schema, Q): changed}), Q) != k0


def test_warmup_quarter_sources_are_in_the_feature_keys() -> None:
    """Features of 2024-Q3 start from 2024-Q2's bars: replacing Q2's trades must move the key."""
    base = stages()
    prev = dt.date(2024, 4, 1)
    ident = lookup_factory()("trades", prev)
    assert ident is not None
    other = lookup_factory({("trades", prev): dataclasses.replace(ident, size=1)})
    for fn in (lineage.bar_features_key, lineage.ofi_features_key, lineage.fxcache_key):
        assert fn(base, other, Q) != fn(base, lookup_factory(), Q), fn.__name__


def test_format_and_code_versions_move_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    base = stages()
    k0 = lineage.fxcache_key(base, lookup_factory(), Q)
    monkeypatch.setitem(lineage.CODE_VERSIONS, "bars", "999")
    assert lineage.fxcache_key(base, lookup_factory(), Q) != k0
    monkeypatch.undo()
    from fx_assets.core import fxcache

    monkeypatch.setattr(fxcache, "FORMAT_VERSION", fxcache.FORMAT_VERSION + 1)
    assert lineage.fxcache_key(base, lookup_factory(), Q) != k0


def test_dagster_config_subclass_gives_the_core_key(tmp_path: Path) -> None:
    """Keys are computed from the core models, so the CLI and the Dagster resource agree."""
    from fx_assets.resources.pipeline import BarsConfig, PipelineConfig

    p = PipelineConfig(bars=BarsConfig(volume_bar_size=250))
    lookup = lookup_factory()
    assert lineage.fxcache_key(p.stage_configs(), lookup, Q) == lineage.fxcache_key(
        dataclasses.replace(stages(), bars=BarConfig(volume_bar_size=250)), lookup, Q
    )
