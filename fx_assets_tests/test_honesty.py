"""The end-to-end leak detector: raw DBN -> features -> fxcache -> trained fold, on a synthetic
market with a planted causal order-flow signal (the model must beat flat out of sample) and on
a null market (it must not: AUC within noise of 0.5, no significant profit)."""

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from fx_assets.definitions import FEATURE_STAGES, build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings
from fx_assets_tests.conftest import make_market

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
FEATURES = list(FEATURE_STAGES)


def train_one_fold(root: Path) -> dict:
    """Build 2024-Q1..Q3 and train the 2024-Q3 fold (2 training quarters); its metrics."""
    defs = build_definitions(
        ProjectSettings(
            data_root=root,
            first_quarter=dt.date(2024, 1, 1),
            last_quarter=dt.date(2024, 7, 1),
            train_quarters=2,
        )
    )
    res = dict(defs.resources or {})
    with dg.instance_for_test() as inst:
        for q in (dt.date(2024, 1, 1), dt.date(2024, 4, 1), dt.date(2024, 7, 1)):
            r = dg.materialize(
                list(defs.assets or []),
                selection=FEATURES,
                partition_key=partition_key(q, "ES.FUT"),
                instance=inst,
                resources=res,
                run_config=QUIET,
            )
            assert r.success
        r = defs.resolve_job_def("train_models").execute_in_process(
            instance=inst, resources=res, run_config=QUIET, partition_key="2024-07|ES.FUT"
        )
        assert r.success
    (ckpt,) = list((root / "models" / "ES.FUT").glob("2024-Q3.*/checkpoint.json"))
    return json.loads(ckpt.read_text())["metrics"]


def auc_se(n: int) -> float:
    return 0.5 / np.sqrt(n / 4)  # rough standard error of an AUC near 0.5 with balanced classes


@pytest.mark.slow
def test_signal_market_beats_flat_out_of_sample(tmp_path: Path) -> None:
    m = train_one_fold(make_market(tmp_path, "2024-Q1:2024-Q3", scale=0.01, seed=21, signal=1.0))
    assert m["auc"] > 0.5 + 3 * auc_se(int(m["n_val_bars"])), m
    assert m["sharpe"] > 0 and m["total_return"] > 0, m


@pytest.mark.slow
def test_null_market_finds_nothing(tmp_path: Path) -> None:
    m = train_one_fold(make_market(tmp_path, "2024-Q1:2024-Q3", scale=0.01, seed=21, signal=0.0))
    assert abs(m["auc"] - 0.5) < 4 * auc_se(int(m["n_val_bars"])), m
    assert abs(m["t_stat"]) < 3.0, m
