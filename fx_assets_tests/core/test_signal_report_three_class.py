"""The signal report's three-class metrics (core/signal_report.py): exact values on a case worked
by hand, the perfect and the constant predictor, a planted model that sees the stationary class
but not the sign (the stationary AUC says what the up-vs-down AUC cannot), bootstrap replicates
equal to the metrics of the resampled rows, binary models with no three-class numbers, and the
binary columns unchanged by a model's class probabilities."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.metrics import auc
from fx_assets.core.signal_report import (
    CLASS_LABELS,
    CLASSES,
    RowUnitData,
    SignalReportConfig,
    _ThreeClass,
    block_starts,
    replicate_counts,
    signal_report,
)

THREE_FIELDS = (
    "n3",
    "acc3",
    "acc3_lo",
    "acc3_hi",
    "auc_stationary",
    "auc_stationary_lo",
    "auc_stationary_hi",
    "auc_macro",
    "auc_macro_lo",
    "auc_macro_hi",
    "share_up",
    "share_stationary",
    "share_stationary_lo",
    "share_stationary_hi",
    "share_down",
)
CFG = SignalReportConfig(n_boot=20, n_perm=20)

# label, P(up), P(stationary), P(down): 10 labelled rows and one undefined (NaN) row
HAND = np.array(
    [
        [1.0, 0.6, 0.3, 0.1],  # argmax up: right
        [1.0, 0.5, 0.2, 0.3],  # up: right
        [1.0, 0.2, 0.5, 0.3],  # stationary: wrong
        [0.0, 0.1, 0.8, 0.1],  # stationary: right
        [0.0, 0.3, 0.4, 0.3],  # stationary: right
        [0.0, 0.4, 0.2, 0.4],  # tie up / down: the first (up) wins: wrong
        [-1.0, 0.1, 0.3, 0.6],  # down: right
        [-1.0, 0.3, 0.3, 0.4],  # down: right
        [-1.0, 0.2, 0.6, 0.2],  # stationary: wrong
        [1.0, 0.3, 0.1, 0.6],  # down: wrong
        [np.nan, 0.9, 0.05, 0.05],  # undefined label: left out of everything
    ]
)


def _score(p: np.ndarray) -> np.ndarray:
    # the three-class MLP's score, rounded so that scores equal on paper are equal in float64
    return np.round(0.5 * (1.0 + p[:, 0] - p[:, 2]), 12)


def _report(y: np.ndarray, p: np.ndarray, **kw: object) -> tuple:
    rep = signal_report(
        {("snapshot", "mlp3"): _score(p)},
        {"snapshot": RowUnitData(labels={5: y})},
        SignalReportConfig(**{"n_boot": 20, "n_perm": 20, **kw}),  # type: ignore[arg-type]
        probabilities={("snapshot", "mlp3"): p},
    )
    return rep, rep.cell("snapshot", "mlp3", 5)


def test_the_class_order_is_the_mlps() -> None:
    from fx_assets.core.trainers.mlp import THREE_CLASSES

    assert CLASSES == THREE_CLASSES and CLASS_LABELS == (1.0, 0.0, -1.0)


def test_exact_metrics_of_a_case_worked_by_hand() -> None:
    y, p = HAND[:, 0], HAND[:, 1:]
    _, c = _report(y, p)
    assert c.n3 == 10  # the NaN row is out
    assert c.acc3 == pytest.approx(6 / 10)  # rows 0, 1, 3, 4, 6, 7
    # P(stationary) of the 3 zero moves (0.8, 0.4, 0.2) against the 7 moves (0.3, 0.2, 0.5, 0.3,
    # 0.3, 0.6, 0.1): 7 + 5 + (1 + 1/2) pairs won of 21
    assert c.auc_stationary == pytest.approx(13.5 / 21)
    # one-vs-rest: up 18.5 / 24 (0.6: 6, 0.5: 6, 0.2: 2 + 1/2, 0.3: 3 + 2/2), down 14 / 21
    # (0.6: 6 + 1/2, 0.4: 5 + 1/2, 0.2: 2)
    assert c.auc_macro == pytest.approx((18.5 / 24 + 13.5 / 21 + 14 / 21) / 3)
    assert (c.share_up, c.share_stationary, c.share_down) == pytest.approx((0.4, 0.3, 0.3))
    # the binary columns are as before: the score over the 7 moved rows
    assert c.n == 7
    assert c.auc == pytest.approx(8.5 / 12)  # up 0.75, 0.6, 0.45, 0.35 against down 0.25, 0.45, 0.5
    assert c.acc == pytest.approx(5 / 7)
    for lo, v, hi in (
        (c.acc3_lo, c.acc3, c.acc3_hi),
        (c.auc_stationary_lo, c.auc_stationary, c.auc_stationary_hi),
        (c.share_stationary_lo, c.share_stationary, c.share_stationary_hi),
    ):
        assert lo is not None and hi is not None and lo <= hi and 0.0 <= lo and hi <= 1.0, (lo, v, hi)


def test_perfect_and_constant_predictors() -> None:
    rng = np.random.default_rng(0)
    n = 600
    y = rng.choice([1.0, 0.0, -1.0], n)
    y[::50] = np.nan
    k = np.where(y > 0, 0, np.where(y < 0, 2, 1))
    perfect = np.full((n, 3), 0.1)
    perfect[np.arange(n), k] = 0.8
    _, c = _report(y, perfect)
    assert c.acc3 == 1.0 and c.auc_stationary == 1.0 and c.auc_macro == 1.0 and c.auc == 1.0
    assert c.acc3_lo == c.acc3_hi == 1.0 and c.auc_stationary_lo == 1.0
    assert c.stationary_in_null_band is False
    flat = np.full((n, 3), 1.0 / 3.0)
    _, c = _report(y, flat)
    assert c.auc_stationary == 0.5 and c.auc_macro == 0.5 and c.auc == 0.5
    assert c.acc3 == pytest.approx(c.share_up)  # all ties: argmax is the first class, up
    assert c.stationary_in_null_band is True


def _planted(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Labels in runs of 5 rows (overlapping labels); a model whose P(stationary) rises on the
    zero moves but whose split of the rest between up and down ignores the sign."""
    y = np.repeat(rng.choice([1.0, 0.0, -1.0], n // 5, p=[0.35, 0.3, 0.35]), 5)
    ps = np.clip(0.25 + 0.25 * (y == 0) + 0.15 * rng.standard_normal(n), 0.01, 0.98)
    split = rng.uniform(0.2, 0.8, n)
    return y, np.column_stack([(1 - ps) * split, ps, (1 - ps) * (1 - split)])


def test_a_model_that_sees_the_stationary_class_but_not_the_sign() -> None:
    y, p = _planted(10_000, np.random.default_rng(1))
    rep, c = _report(y, p, n_perm=100)
    assert c.auc_stationary > 0.75 and c.auc_stationary_lo > 0.7, c  # type: ignore[operator]
    assert c.stationary_in_null_band is False
    assert abs(c.auc - 0.5) < 0.03 and c.in_null_band is True, c  # up vs down: nothing
    assert c.auc_macro is not None and c.auc_stationary > c.auc_macro > 0.5
    assert "stat AUC" in rep.markdown() and f"{c.auc_stationary:.4f}*" in rep.markdown()


def test_replicate_metrics_equal_those_of_the_resampled_rows() -> None:
    """The one-pass weighted three-class metrics of a bootstrap replicate equal the metrics of the
    rows repeated by their counts (ties included: probabilities on a coarse grid)."""
    rng = np.random.default_rng(3)
    n = 2000
    y, p = _planted(n, rng)
    p = np.round(p, 1)
    k = np.where(y > 0, 0, np.where(y < 0, 2, 1))
    # the cell's rows are a shuffled part of the unit's rows (weights are looked up through them)
    n_unit = n + 137
    rows = rng.permutation(n_unit)[:n]
    tc = _ThreeClass.of(p, k, rows)
    starts = block_starts(n_unit, 30, 3, rng)
    for b in range(3):
        cnt = replicate_counts(starts[b], n_unit, 30)
        idx = np.repeat(np.arange(n), cnt[rows])
        pk, kk = p[idx], k[idx]
        aucs = [auc(pk[:, j], kk == j) for j in range(3)]
        want = (
            float((np.argmax(pk, axis=1) == kk).mean()),
            aucs[1],
            float(np.mean(aucs)),
            *(float((kk == j).mean()) for j in range(3)),
        )
        assert tc.metrics(cnt) == pytest.approx(want)


def test_binary_models_have_no_three_class_numbers(tmp_path: Path) -> None:
    y, p = HAND[:, 0], HAND[:, 1:]
    y10, p10 = np.tile(y, 30), np.tile(p, (30, 1))
    unit = {"snapshot": RowUnitData(labels={5: y10})}
    binary = signal_report({("snapshot", "gbt"): _score(p10)}, unit, CFG)
    both = signal_report(
        {("snapshot", "gbt"): _score(p10), ("snapshot", "mlp3"): _score(p10)},
        unit,
        CFG,
        probabilities={("snapshot", "mlp3"): p10},
    )
    for rep in (binary, both):
        c = rep.cell("snapshot", "gbt", 5)
        assert not c.three_class
        for f in (*THREE_FIELDS, "stationary_null_sd", "stationary_null_p", "stationary_in_null_band"):
            assert getattr(c, f) is None, f
    assert "Three-class" not in binary.markdown() and "n/a" not in binary.markdown()
    md = both.markdown()
    assert "## Three-class by horizon" in md and "| 5 | n/a (binary) | acc3 0.6000" in md
    import json

    doc = json.loads(both.write(tmp_path)["json"].read_text())
    gbt = [c for c in doc["cells"] if c["model"] == "gbt"]
    assert gbt and all(c["acc3"] is None and c["auc_stationary"] is None for c in gbt)
    mlp = [c for c in doc["cells"] if c["model"] == "mlp3"]
    assert mlp[0]["acc3"] == pytest.approx(0.6)
    # the same model's binary columns whether or not it gave class probabilities
    a, b = binary.cell("snapshot", "gbt", 5), both.cell("snapshot", "mlp3", 5)
    for f in ("n", "auc", "auc_lo", "auc_hi", "acc", "acc_lo", "acc_hi", "null_sd", "null_p", "in_null_band"):
        assert getattr(a, f) == getattr(b, f) or (math.isnan(getattr(a, f)) and math.isnan(getattr(b, f))), f


def test_three_class_by_regime_bin() -> None:
    rng = np.random.default_rng(4)
    n = 5000
    y, p = _planted(n, rng)
    spread = rng.random(n)
    rep = signal_report(
        {("snapshot", "mlp3"): _score(p)},
        {
            "snapshot": RowUnitData(
                labels={5: y}, regimes_valid={"spread": spread}, regimes_train={"spread": rng.random(n)}
            )
        },
        CFG,
        probabilities={("snapshot", "mlp3"): p},
    )
    edges = [-np.inf, *rep.regime_edges["snapshot"]["spread"], np.inf]
    k = np.where(y > 0, 0, np.where(y < 0, 2, 1))
    for q in range(1, 6):
        c = rep.cell("snapshot", "mlp3", 5, "spread", q)
        m = (spread >= edges[q - 1]) & (spread < edges[q])
        assert c.n3 == int(m.sum())
        assert c.auc_stationary == pytest.approx(auc(p[m, 1], k[m] == 1))
        assert c.acc3 == pytest.approx(float((np.argmax(p[m], axis=1) == k[m]).mean()))
        assert c.stationary_null_sd is None  # the null band is the "all" cell's
    assert "h = 5, three-class" in rep.markdown()


def test_class_probabilities_are_checked() -> None:
    y, p = HAND[:, 0], HAND[:, 1:]
    unit = {"snapshot": RowUnitData(labels={5: y})}
    pred = {("snapshot", "m"): _score(p)}
    with pytest.raises(FxDataError, match="expected"):
        signal_report(pred, unit, CFG, probabilities={("snapshot", "m"): p[:, :2]})
    bad = p.copy()
    bad[3, 1] = 0.9  # the row sums to 1.1
    with pytest.raises(FxDataError, match="row 3"):
        signal_report(pred, unit, CFG, probabilities={("snapshot", "m"): bad})
    with pytest.raises(FxDataError, match="no scores"):
        signal_report(pred, unit, CFG, probabilities={("snapshot", "other"): p})
