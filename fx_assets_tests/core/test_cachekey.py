"""Cache keys are complete (DESIGN §5.3): every config field, source identity field, the
format version and the code version move the key; keys are stable across processes."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import textwrap
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, Field

from fx_assets.core.cachekey import (
    SourceIdentity,
    cache_key,
    config_fields,
    field_info_at,
    get_field,
    hexkey,
    keyed_name,
    mutate_field_value,
    replace_field,
)
from fx_assets.core.checksum import hash_file
from fx_assets.core.fxcache import open_fxcache, write_fxcache


class Side(enum.Enum):
    BUY = "buy"
    SELL = "sell"


class WindowConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    span: int = Field(default=20, ge=2)
    alpha: float = Field(default=0.1, gt=0.0, le=1.0)
    adjust: bool = False


class BarConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["volume", "tick", "imbalance"] = "volume"
    volume_per_bar: int = Field(default=100, ge=1)
    imbalance_threshold: float = 0.5
    ewma_alpha: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    split_on_roll: bool = True


class FeatureConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    windows: tuple[int, ...] = (5, 20, 100)
    band: tuple[float, float] = (2.0, 3.0)
    side: Side = Side.BUY
    name: str = "default"
    smoothing: WindowConfig = WindowConfig()
    maybe_cap: float | None = 3.0

    @pydantic.model_validator(mode="after")
    def _band_ordered(self) -> FeatureConfig:
        if self.band[0] > self.band[1]:
            raise ValueError("band must be ordered")
        return self


CONFIGS: list[BaseModel] = [BarConfig(), FeatureConfig()]
SOURCES = [
    SourceIdentity("/data/raw/trades/ES.FUT/ES.FUT_2024-Q1.dbn.zst", 123456, "xxh3-128:" + "ab" * 16),
    SourceIdentity("/data/raw/mbp-10/ES.FUT/ES.FUT_2024-Q1.dbn.zst", 654321, "xxh3-128:" + "cd" * 16),
]


def key_of(
    configs: list[BaseModel], sources: list[SourceIdentity] = SOURCES, fv: int = 1, cv: str = "1"
) -> bytes:
    return cache_key(configs=configs, sources=sources, format_version=fv, code_version=cv)


def test_config_fields_walks_nested_models() -> None:
    assert config_fields(BarConfig) == [
        "kind",
        "volume_per_bar",
        "imbalance_threshold",
        "ewma_alpha",
        "split_on_roll",
    ]
    assert "smoothing.alpha" in config_fields(FeatureConfig)
    assert "smoothing" not in config_fields(FeatureConfig)


def test_every_config_field_changes_the_key() -> None:
    base = key_of(CONFIGS)
    assert len(base) == 32
    seen = {base}
    mutated_paths = []
    for ci, cfg in enumerate(CONFIGS):
        for path in config_fields(type(cfg)):
            info = field_info_at(type(cfg), path)
            old = get_field(cfg, path)
            new_cfg = None
            for candidate in mutate_field_value(old, info):
                try:
                    new_cfg = replace_field(cfg, path, candidate)
                except pydantic.ValidationError:
                    continue
                break
            assert new_cfg is not None, f"no valid mutation for {type(cfg).__name__}.{path}"
            assert get_field(new_cfg, path) != old
            configs = list(CONFIGS)
            configs[ci] = new_cfg
            k = key_of(configs)
            assert k != base, f"changing {type(cfg).__name__}.{path} did not change the key"
            assert k not in seen, f"{path}: collides with another mutation"
            seen.add(k)
            mutated_paths.append(f"{type(cfg).__name__}.{path}")
    # every leaf of both models was exercised
    assert len(mutated_paths) == len(config_fields(BarConfig)) + len(config_fields(FeatureConfig))


def test_mutate_handles_each_type() -> None:
    for path, expect_type in [
        ("windows", tuple),
        ("band", tuple),
        ("side", Side),
        ("smoothing.adjust", bool),
    ]:
        info = field_info_at(FeatureConfig, path)
        old = get_field(FeatureConfig(), path)
        new = next(iter(mutate_field_value(old, info)))
        assert isinstance(new, expect_type) and new != old
    # a nested model field as a whole mutates to a different valid model
    info = FeatureConfig.model_fields["smoothing"]
    new_model = next(iter(mutate_field_value(WindowConfig(), info)))
    assert isinstance(new_model, WindowConfig) and new_model != WindowConfig()
    # an Optional left at None gets a value of its inner type
    info = field_info_at(FeatureConfig, "maybe_cap")
    assert next(iter(mutate_field_value(None, info))) == 1.0
    assert key_of([FeatureConfig(maybe_cap=None)]) != key_of([FeatureConfig(maybe_cap=1.0)])
    # bounds are respected: alpha <= 1.0 at the upper bound moves down
    info = field_info_at(FeatureConfig, "smoothing.alpha")
    assert all(0.0 < v <= 1.0 for v in mutate_field_value(1.0, info))


def test_class_identity_is_in_the_key() -> None:
    class OtherWindow(BaseModel):  # same fields and values, different class
        model_config = ConfigDict(frozen=True)
        span: int = 20
        alpha: float = 0.1
        adjust: bool = False

    assert key_of([WindowConfig()]) != key_of([OtherWindow()])


def test_sources_format_and_code_version_change_the_key() -> None:
    base = key_of(CONFIGS)
    new_values: dict[str, Any] = {
        "path": "/elsewhere.dbn.zst",
        "size": 1,
        "content_hash": "xxh3-128:" + "ef" * 16,
    }
    for si in range(len(SOURCES)):
        for f in fields(SourceIdentity):
            srcs = list(SOURCES)
            srcs[si] = replace(srcs[si], **{f.name: new_values[f.name]})
            assert key_of(CONFIGS, srcs) != base, f"source {si}.{f.name} not in the key"
    assert key_of(CONFIGS, SOURCES[:1]) != base
    assert key_of(CONFIGS, fv=2) != base
    assert key_of(CONFIGS, cv="2") != base
    assert key_of(CONFIGS) == base  # and it is a pure function


def test_float_repr_distinguishes_close_values() -> None:
    a = key_of([BarConfig(imbalance_threshold=0.1 + 0.2)])
    b = key_of([BarConfig(imbalance_threshold=0.3)])
    assert a != b


def test_key_is_identical_in_another_process() -> None:
    here = hexkey(key_of(CONFIGS), 64)
    # The child imports this test module (models defined here) under PYTHONHASHSEED=random.
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        from fx_assets_tests.core import test_cachekey as t
        from fx_assets.core.cachekey import hexkey
        print(hexkey(t.key_of(t.CONFIGS), 64))
        """
    ).format(root=str(Path(__file__).resolve().parents[2]))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == here


def test_source_identity_from_path(tmp_path: Path) -> None:
    f = tmp_path / "x.dbn.zst"
    f.write_bytes(b"DBN\x02" + bytes(100))
    a = SourceIdentity.from_path(f)
    assert a.size == 104 and a.path == str(f.resolve()) and a.content_hash == hash_file(f)
    f.write_bytes(b"DBN\x03" + bytes(100))  # same size, new content
    b = SourceIdentity.from_path(f)
    assert b.size == a.size and b.content_hash != a.content_hash
    assert key_of(CONFIGS, [a]) != key_of(CONFIGS, [b])
    given = "xxh3-128:" + "00" * 16
    assert SourceIdentity.from_path(f, content_hash=given).content_hash == given


def test_change_after_the_first_64_kib_with_same_size_and_mtime_moves_the_identity(tmp_path: Path) -> None:
    """Found 4: identity was (path, size, mtime, hash of the first 64 KiB)."""
    f = tmp_path / "raw.dbn.zst"
    data = bytearray(np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    f.write_bytes(bytes(data))
    record = tmp_path / "records"
    a = SourceIdentity.from_path(f, record_dir=record)
    st = f.stat()
    data[(1 << 16) + 12345] ^= 0xFF  # one byte after the first 64 KiB
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    b = SourceIdentity.from_path(f, record_dir=record)
    assert b.content_hash != a.content_hash and b.content_hash == hash_file(f)
    assert key_of(CONFIGS, [a]) != key_of(CONFIGS, [b])


def test_recorded_hash_is_reused_while_the_stat_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fx_assets.core import source_hash

    f = tmp_path / "raw.dbn"
    f.write_bytes(b"DBN\x02" + bytes(1000))
    rec = tmp_path / "records"
    first = source_hash.content_hash(f, rec)
    calls = []
    real = source_hash.hash_file
    monkeypatch.setattr(source_hash, "hash_file", lambda p: calls.append(p) or real(p))
    assert source_hash.content_hash(f, rec) == first and calls == []  # from the record
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # stat moved: hashed again
    assert source_hash.content_hash(f, rec) == first and len(calls) == 1
    assert source_hash.content_hash(f, rec) == first and len(calls) == 1


def test_two_parameter_sets_coexist_in_one_directory(tmp_path: Path) -> None:
    k1 = key_of([BarConfig(volume_per_bar=100)])
    k2 = key_of([BarConfig(volume_per_bar=500)])
    n1 = keyed_name("ES.FUT_2024-Q1", k1, ".fxcache")
    n2 = keyed_name("ES.FUT_2024-Q1", k2, ".fxcache")
    assert n1 != n2
    ts = np.arange(10, dtype=np.int64)
    p1 = write_fxcache(tmp_path / n1, ts, {"price": (["close"], np.full((10, 1), 1.0))}, "f64", k1, {})
    p2 = write_fxcache(tmp_path / n2, ts, {"price": (["close"], np.full((10, 1), 2.0))}, "f64", k2, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([n1, n2])
    with open_fxcache(p1) as a, open_fxcache(p2) as b:
        assert a.cache_key == k1 and b.cache_key == k2
        assert a.column("close")[0] == 1.0 and b.column("close")[0] == 2.0


def test_rejects_non_models() -> None:
    with pytest.raises(TypeError):
        cache_key(configs=[{"a": 1}], sources=[], format_version=1, code_version="1")  # type: ignore[list-item]
