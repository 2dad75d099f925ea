"""The end-to-end leak detector, through the real pipeline (Dagster: raw DBN -> features ->
fxcache -> fold ranges -> trained fold), for the MLP and the DQN:

- on a null market the detector passes: the validation AUCs lie within LEAK_Z sds of their
  empirical null (labels permuted in blocks longer than the longest label horizon, computed by
  the trainer: ``auc_null_z``, ``auc_h1_null_z``) and there is no significant daily profit; the
  MLP, whose no-trade band is chosen after costs on the inner block, stays flat;
- on a market with the planted order-flow signal the same detector fails for the MLP (its
  sensitivity at the planted signal's size: AUC 0.56, z 4.1) and the MLP loses nothing after
  costs; at this scale (19 inner sessions) no after-cost edge is significant, so its band stays
  flat (the core tests show it trading a strong edge at a positive net Sharpe). The small DQN
  earns a positive gross Sharpe there;
- mutation test: the null market with one test-only fxcache input that looks one bar ahead
  fails the detector, for both trainers.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest

from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.resources.training import FoldsConfig, TrainerConfig, TrainingConfig
from fx_assets.settings import ProjectSettings
from fx_assets_tests.conftest import make_market

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
FEATURES = list(FEATURE_STAGES)
QUARTERS = (dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1))
SCALE, SEED = 0.01, 21
LEAK_Z = 3.0  # |AUC - 0.5| in sds of its block-permutation null (~0.3% two-sided per statistic)
LEAK_RHO = 0.3  # correlation of the planted look-ahead input with the return it looks at
TRAINERS: dict[str, dict[str, Any]] = {
    "mlp": {"trainer": "mlp"},
    # small enough for 2 shared CPU cores (the core tests' DQN), long enough to find the signal
    "dqn": {
        "trainer": "dqn",
        "epochs": 5,
        "batch_size": 256,
        "lr": 3e-3,
        "hidden": [32],
        "gamma": 0.5,
        "tau": 0.02,
        "n_envs": 64,
        "episode_len": 128,
        "learn_starts": 512,
        "eps_decay_steps": 600,
        "max_steps_per_epoch": 250,
        "replay_size": 20_000,
    },
}


def detector_flags(m: dict[str, float]) -> list[str]:
    """What the leak detector objects to: AUCs beyond LEAK_Z null sds, or a daily t above 3."""
    flags = [k for k in ("auc_null_z", "auc_h1_null_z") if abs(m[k]) >= LEAK_Z]
    if math.isfinite(m["sharpe"]) and m["sharpe"] / math.sqrt(252) * math.sqrt(m["n_sessions"]) >= 3.0:
        flags.append("sharpe")
    return flags


def _defs(root: Path) -> dg.Definitions:
    return build_definitions(
        ProjectSettings(
            data_root=root, first_quarter=QUARTERS[0], last_quarter=QUARTERS[-1], train_quarters=2
        )
    )


def build_features(root: Path) -> None:
    defs = _defs(root)
    with dg.instance_for_test() as inst:
        for q in QUARTERS:
            r = dg.materialize(
                list(defs.assets or []),
                selection=FEATURES,
                partition_key=partition_key(q, "ES.FUT"),
                instance=inst,
                resources=dict(defs.resources or {}),
                run_config=QUIET,
            )
            assert r.success


def train_fold(root: Path, trainer: str) -> dict[str, float]:
    """Train the 2024-Q3 fold (2 training quarters) with ``trainer``; its checkpoint metrics."""
    defs = _defs(root)
    res = dict(defs.resources or {})
    base: TrainingConfig = res["training"]
    res["training"] = TrainingConfig(
        folds=FoldsConfig(**base.folds.model_dump()),
        train=TrainerConfig(**{**base.train.model_dump(), **TRAINERS[trainer]}),
    )
    with dg.instance_for_test() as inst:
        r = defs.resolve_job_def("train_models").execute_in_process(
            instance=inst, resources=res, run_config=QUIET, partition_key="2024-07|ES.FUT"
        )
        assert r.success
    found = [
        json.loads(p.read_text())
        for p in (root / "models" / "ES.FUT").glob("2024-Q3.*/checkpoint.json")
        if json.loads(p.read_text())["config"]["trainer"] == trainer
    ]
    assert len(found) == 1, found
    return found[0]["metrics"]


def _leaky_assembly(original: Any) -> Any:
    """``assemble_fxcache_columns`` plus one test-only input: at row j the return the position
    earns next (entry lag 1: ln C[j+2] - ln C[j+1]) mixed with noise, correlation LEAK_RHO."""

    def assemble(*args: Any, **kw: Any) -> Any:
        ts, groups, dropped = original(*args, **kw)
        names, values = groups["price"]
        logc = np.log(values[:, names.index("close")])
        fwd = np.zeros(ts.shape[0])
        fwd[:-2] = logc[2:] - logc[1:-1]
        noise = np.random.default_rng(int(ts[0]) % 2**32 if ts.size else 0).standard_normal(ts.shape[0])
        leak = LEAK_RHO * fwd / (fwd.std() or 1.0) + math.sqrt(1 - LEAK_RHO**2) * noise
        f_names, f_values = groups["feature"]
        groups = {
            **groups,
            "feature": ([*f_names, "test_leak_next_return"], np.column_stack([f_values, leak])),
        }
        return ts, groups, dropped

    return assemble


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, dict[str, float]]]]:
    """Metrics by market (null, signal, leak) and trainer; each market built once."""
    import fx_assets.assets.features as features_assets

    out: dict[str, dict[str, dict[str, float]]] = {}
    roots: dict[str, Path] = {}
    for market, signal in (("null", 0.0), ("signal", 1.0)):
        root = roots[market] = make_market(
            tmp_path_factory.mktemp(market), "2024-Q1:2024-Q3", scale=SCALE, seed=SEED, signal=signal
        )
        build_features(root)
        out[market] = {t: train_fold(root, t) for t in TRAINERS}
    root = tmp_path_factory.mktemp("leak")
    shutil.copytree(roots["null"] / "raw", root / "raw")  # the null market's DBN files
    mp = pytest.MonkeyPatch()
    mp.setattr(
        features_assets, "assemble_fxcache_columns", _leaky_assembly(features_assets.assemble_fxcache_columns)
    )
    try:
        build_features(root)
    finally:
        mp.undo()
    out["leak"] = {t: train_fold(root, t) for t in TRAINERS}
    for market, by in out.items():
        for t, m in by.items():
            keys = ("auc", "auc_h1", "auc_null_z", "auc_h1_null_z", "gross_sharpe", "net_sharpe", "turnover")
            print(market, t, {k: round(m.get(k, float("nan")), 4) for k in keys}, detector_flags(m))
    yield out


@pytest.mark.slow
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_null_market_passes_the_detector(results: dict, trainer: str) -> None:
    m = results["null"][trainer]
    assert detector_flags(m) == [], m
    if trainer == "mlp":  # a model without edge stays flat: no turnover, no loss to speak of
        assert m["turnover"] < 0.01 and m["net_total_log_return"] > -0.01, m


@pytest.mark.slow
def test_signal_market_fails_the_detector_and_loses_nothing_after_costs(results: dict) -> None:
    m = results["signal"]["mlp"]
    assert {"auc_null_z", "auc_h1_null_z"} & set(detector_flags(m)), m
    assert m["net_total_log_return"] >= 0 and m["gross_sharpe"] >= m["net_sharpe"], m
    d = results["signal"]["dqn"]  # the DQN through the same pipeline finds the signal
    assert d["auc"] > 0.5 and d["gross_sharpe"] > 1.0 and d["gross_sharpe"] > d["net_sharpe"], d


@pytest.mark.slow
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_planted_lookahead_input_fails_the_detector_on_the_null_market(results: dict, trainer: str) -> None:
    m = results["leak"][trainer]
    assert detector_flags(m), m
