"""Code versions come from the code (issue 8.2): a kernel change in a copy of the package moves
exactly the versions and keys of the stages that use it (and, through the chained keys, those
downstream); comments, docstrings, descriptions and formatting move nothing."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fx_assets.core import codeversion, lineage
from fx_assets.core.bar_features import BarFeatureConfig
from fx_assets.core.bars import BarConfig
from fx_assets.core.cachekey import SourceIdentity
from fx_assets.core.folds import FoldConfig
from fx_assets.core.lineage import FxCacheConfig, StageConfigs
from fx_assets.core.ofi import OfiConfig
from fx_assets.core.trainers.common import TrainConfig

REPO = Path(__file__).resolve().parents[2]
Q = dt.date(2024, 7, 1)
FEATURE_KEYS = ("roll_calendar", "bars", "bar_features", "ofi_features", "fxcache")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package as it is (edited copies are made from it)."""
    root = tmp_path_factory.mktemp("pkg")
    shutil.copytree(REPO / "fx_assets", root / "fx_assets", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def base_versions(pristine: Path) -> dict[str, str]:
    return codeversion.compute_stage_versions(pristine)


def edited(pristine: Path, tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    """A copy of the package with textual edits ``{relative file: [(old, new), ...]}``."""
    root = tmp_path / "edited"
    shutil.copytree(pristine, root)
    for rel, pairs in edits.items():
        p = root / "fx_assets" / rel
        text = p.read_text()
        for old, new in pairs:
            assert text.count(old) == 1, f"{rel}: {old!r} is not unique"
            text = text.replace(old, new)
        p.write_text(text)
    return root


def keys_with(versions: dict[str, str]) -> dict[str, str]:
    """Every stage key of one partition, computed with the given code versions."""

    def lookup(schema: str, quarter: dt.date) -> SourceIdentity | None:
        return SourceIdentity(f"/raw/{schema}/{quarter}.dbn.zst", 1000, "xxh3-128:" + "ab" * 16)

    mp = pytest.MonkeyPatch()
    mp.setattr(codeversion, "stage_version", lambda s: versions[s])
    try:
        cfg = StageConfigs(BarConfig(), BarFeatureConfig(), OfiConfig(), FxCacheConfig())
        n: Callable[[dt.date], int] = lambda q: 10**6  # noqa: E731
        keys = {
            "roll_calendar": lineage.roll_calendar_key(lookup, Q),
            "bars": lineage.bars_key(cfg, lookup, Q),
            "bar_features": lineage.bar_features_key(cfg, lookup, Q, n),
            "ofi_features": lineage.ofi_features_key(cfg, lookup, Q),
            "fxcache": lineage.fxcache_key(cfg, lookup, Q, n),
        }
        fx = [keys["fxcache"]] * 3
        folds, train = FoldConfig(train_quarters=2, purge_bars=31, warmup_bars=0), TrainConfig(trainer="mlp")
        keys["fold_ranges"] = lineage.fold_ranges_key(fx, folds, train.purge_bars)
        keys["trained_model"] = lineage.trained_model_key(
            fx, folds, train, {"device_kind": "cpu"}, label_horizon=train.purge_bars
        )
    finally:
        mp.undo()
    return keys


def changed(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {k for k in a if a[k] != b[k]}


def test_versions_cover_every_stage_and_are_hex(base_versions: dict[str, str]) -> None:
    assert set(base_versions) == set(codeversion.STAGE_ENTRIES)
    for v in base_versions.values():
        assert len(v) == codeversion.VERSION_CHARS and int(v, 16) >= 0
    assert len(set(base_versions.values())) == len(base_versions), "two stages share all their code"


def test_the_running_package_is_found_in_a_subprocess(
    pristine: Path, base_versions: dict[str, str], tmp_path: Path
) -> None:
    """With a copy on PYTHONPATH, the versions a process computes are those of that copy (the
    second process reads them back from the cache)."""
    root = edited(
        pristine,
        tmp_path,
        {"core/bars.py": [("return a + (a == 0) * tick\n", "return a + (a == 0) * tick * 1\n")]},
    )
    script = (
        "import json, fx_assets; from fx_assets.core import codeversion as c; "
        "print(json.dumps([fx_assets.__file__, c.stage_versions()]))"
    )
    env = {**os.environ, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout))
    for file, versions in runs:
        assert file.startswith(str(root))
        assert changed(base_versions, versions) == {"bars"}
    assert runs[0][1] == runs[1][1]
    assert len(list((tmp_path / "cache" / "fx_assets").glob("codeversions-*.json"))) == 1


EDITS: dict[str, tuple[dict[str, list[tuple[str, str]]], set[str], set[str]]] = {
    # name: (edits, stages whose own version changes, stages whose key changes)
    "bar kernel": (
        {"core/bars.py": [("return a + (a == 0) * tick\n", "return a + (a == 0) * tick * 2\n")]},
        {"bars"},
        {"bars", "bar_features", "ofi_features", "fxcache", "fold_ranges", "trained_model"},
    ),
    "OFI kernel constant": (
        {"core/ofi.py": [("MIN_DURATION_S = 1e-6  #", "MIN_DURATION_S = 2e-6  #")]},
        {"ofi_features"},
        {"ofi_features", "fxcache", "fold_ranges", "trained_model"},
    ),
    "trainer": (
        {
            "core/trainers/mlp.py": [
                ("import torch\n", "import torch\n\n_UNUSED_BY_NAME = 1\nprint(_UNUSED_BY_NAME)\n")
            ]
        },
        {"trained_model"},
        {"trained_model"},
    ),
    # Modules the training layer imports inside functions only (so that loading the definitions
    # does not import torch): a change there still moves the stages that call them.
    "fold planning (imported inside a resource method)": (
        {
            "core/fold_stream.py": [
                (
                    'return "resident" if need_bytes <= budget_bytes',
                    'return "resident" if need_bytes < budget_bytes',
                )
            ]
        },
        # the reports that find the fold's model through the device loader's key settings
        {"trained_model", "walk_forward_report", "signal_report", "signal_report_stitched"},
        {"trained_model"},
    ),
    "transition warm-up (imported inside the asset function)": (
        {"core/trainers/transition.py": [("n_tr = max(64, 2 * reach)", "n_tr = max(65, 2 * reach)")]},
        {"trained_model"},
        {"trained_model"},
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_code_change_moves_exactly_the_dependent_stages(
    name: str, pristine: Path, base_versions: dict[str, str], tmp_path: Path
) -> None:
    edits, own, keyed = EDITS[name]
    versions = codeversion.compute_stage_versions(edited(pristine, tmp_path, edits))
    assert changed(base_versions, versions) == own
    assert changed(keys_with(base_versions), keys_with(versions)) == keyed


def test_comments_docstrings_descriptions_and_formatting_change_nothing(
    pristine: Path, base_versions: dict[str, str], tmp_path: Path
) -> None:
    edits = {
        "core/bars.py": [
            ("return a + (a == 0) * tick\n", "return a + (a == 0)*tick  # the tick rule where unknown\n"),
            (
                '"""Aggressor sign if known, else the tick rule',
                '"""Aggressor sign if known (reworded), else the tick rule',
            ),
            ('description="Contract multiplier, USD', 'description="The contract multiplier, USD'),
        ],
        "core/ofi.py": [("MIN_DURATION_S = 1e-6  #", "\n# a comment\nMIN_DURATION_S = (\n    1e-6\n)  #")],
        "core/roll.py": [("Roll calendar: which outright", "Roll calendar (reworded): which outright")],
    }
    versions = codeversion.compute_stage_versions(edited(pristine, tmp_path, edits))
    assert versions == base_versions


def test_the_asset_code_versions_are_the_derived_ones() -> None:
    """Dagster marks an asset unsynced when its code_version moves: each asset carries its
    stage's derived version."""
    from fx_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    for stage in ("roll_calendar", "bars", "bar_features", "ofi_features", "fxcache", "fold_ranges",
                  "trained_model", "walk_forward_report", "signal_report", "signal_report_stitched"):  # fmt: skip
        import dagster as dg

        assert graph.get(dg.AssetKey(stage)).code_version == codeversion.stage_version(stage), stage
    assert codeversion.stage_version("predecoded") in graph.get(dg.AssetKey("predecoded_trades")).code_version


def test_unknown_stage_and_entries_fail_clearly(pristine: Path) -> None:
    with pytest.raises(KeyError, match="unknown stage"):
        codeversion.stage_version("nope")
    with pytest.raises(LookupError, match="defines no"):
        codeversion.compute_stage_versions(pristine, {"x": ("fx_assets.core.bars:no_such_function",)})


def test_lineage_keys_use_the_derived_versions() -> None:
    """Without any patching, the keys are those of the versions the code gives."""
    versions = codeversion.stage_versions()
    cfg = StageConfigs(BarConfig(), BarFeatureConfig(), OfiConfig(), FxCacheConfig())

    def lookup(schema: str, quarter: dt.date) -> SourceIdentity | None:
        return SourceIdentity(f"/raw/{schema}/{quarter}.dbn.zst", 1000, "xxh3-128:" + "ab" * 16)

    assert lineage.fxcache_key(cfg, lookup, Q, lambda q: 10**6) == keys_with(versions)["fxcache"]


SYNTH = {
    "__init__.py": '"""pkg"""\n',
    "core/__init__.py": "",
    "core/k.py": (
        '"""kernels"""\nSCALE = 2\nOTHER = 3\n\n\ndef kern(x):\n    """doc"""\n    return x * SCALE\n\n\n'
        "def unrelated(x):\n    return x + OTHER\n\n\nREGISTRY = []\nREGISTRY.append(kern)\n"
    ),
    "core/reexport.py": "from fx_assets.core.k import kern as kern2\n",
    "m.py": (
        "from fx_assets.core import k as kmod\nfrom fx_assets.core.reexport import kern2\n\n\n"
        "def factory(flag):\n    HELPER_C = 5\n    UNUSED_C = 6\n\n"
        "    def helper(x):\n        return kmod.REGISTRY[0](x) + HELPER_C\n\n"
        "    @decorate(description='wiring')\n    def inner(x):\n        return helper(x) + kern2(x)\n\n"
        "    return inner\n"
    ),
}


def synth_versions(tmp_path: Path, **edits: tuple[str, str]) -> str:
    root = tmp_path / f"synth{len(list(tmp_path.iterdir()))}"
    for rel, text in SYNTH.items():
        for file, (old, new) in edits.items():
            if file.replace("__", "/") + ".py" == rel:
                assert old in text
                text = text.replace(old, new)
        p = root / "fx_assets" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return codeversion.compute_stage_versions(root, {"s": ("fx_assets.m:factory.inner",)})["s"]


def test_the_walk_follows_aliases_reexports_factory_locals_and_registries(tmp_path: Path) -> None:
    base = synth_versions(tmp_path)
    moves = {
        "kernel constant": {"core__k": ("SCALE = 2", "SCALE = 4")},
        "factory-local helper": {"m": ("HELPER_C = 5", "HELPER_C = 7")},
        "module-level registry fill": {
            "core__k": ("REGISTRY.append(kern)", "REGISTRY.append(kern)\nREGISTRY.append(kern)")
        },
        "entry body": {"m": ("return helper(x) + kern2(x)", "return helper(x) - kern2(x)")},
    }
    for what, edit in moves.items():
        assert synth_versions(tmp_path, **edit) != base, what
    stays = {
        "unrelated function": {"core__k": ("OTHER = 3", "OTHER = 9")},
        "unused factory local": {"m": ("UNUSED_C = 6", "UNUSED_C = 8")},
        "entry decorator (wiring)": {"m": ("description='wiring'", "description='other'")},
        "docstring": {"core__k": ('"""doc"""', '"""other doc"""')},
    }
    for what, edit in stays.items():
        assert synth_versions(tmp_path, **edit) == base, what
