"""The signal report (core/signal_report.py): block-bootstrap intervals cover a known AUC (an iid
bootstrap does not), regime edges come from training rows only, models and row units sit side
by side, the decay curve of the planted market peaks at the planted horizon, and on the null
market every horizon's AUC is inside the empirical-null band."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fx_assets.core import snapshot_labels as sl
from fx_assets.core.errors import FxDataError
from fx_assets.core.metrics import auc
from fx_assets.core.signal_report import (
    Predictions,
    RowUnitData,
    SignalReport,
    SignalReportConfig,
    regime_bins,
    regime_edges,
    signal_report,
)
from fx_assets.core.synth import SynthConfig
from fx_assets.core.trainers.gbt import GbtConfig, train_gbt
from fx_assets_tests.core.test_synth_snapsig import DENSE, front_rows


def _dependent(n: int, d: float, run: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Labels constant over runs of ``run`` rows (like overlapping labels) and scores
    ``d * 1{up} + e`` with e an AR(1) of unit variance (rho 0.95): the population AUC is
    exactly Phi(d / sqrt 2) (s | up ~ N(d, 1), s | down ~ N(0, 1))."""
    y = np.repeat(np.where(rng.random(-(-n // run)) < 0.5, 1.0, -1.0), run)[:n]
    rho = 0.95
    z = rng.standard_normal(n) * math.sqrt(1 - rho**2)
    e = np.empty(n)
    e[0] = rng.standard_normal()
    for i in range(1, n):
        e[i] = rho * e[i - 1] + z[i]
    return d * (y > 0) + e, y


def _p(score: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-score))  # a probability with the score's ranks


def test_block_bootstrap_covers_a_known_auc_and_iid_does_not() -> None:
    d = 0.4
    truth = 0.5 * (1.0 + math.erf(d / 2.0))  # Phi(d / sqrt 2)
    rng = np.random.default_rng(0)
    hit_block = hit_iid = 0
    reps = 30
    for r in range(reps):
        s, y = _dependent(8000, d, 50, rng)
        unit = {"snapshot": RowUnitData(labels={50: y})}
        pred = {("snapshot", "m"): _p(s)}
        blk = signal_report(pred, unit, SignalReportConfig(n_boot=100, block_factor=5.0, n_perm=10, seed=r))
        iid = signal_report(
            pred, unit, SignalReportConfig(n_boot=100, block_factor=1.0, block_min=1, n_perm=10, seed=r)
        )
        cb, ci = blk.cell("snapshot", "m", 50), iid.cell("snapshot", "m", 50)
        assert cb.auc == pytest.approx(auc(_p(s), y > 0))
        hit_block += cb.auc_lo <= truth <= cb.auc_hi
        # block_factor 1 with h = 50 is still blocks of 50; the iid bootstrap is block_min 1 at h = 1
        iid1 = signal_report(
            {("u", "m"): _p(s)},
            {"u": RowUnitData(labels={1: y})},
            SignalReportConfig(n_boot=100, n_perm=10, seed=r),
        )
        c1 = iid1.cell("u", "m", 1)
        hit_iid += c1.auc_lo <= truth <= c1.auc_hi
        assert ci.auc_lo <= ci.auc <= ci.auc_hi
    assert hit_block >= 0.8 * reps, hit_block
    assert hit_iid <= 0.6 * reps, hit_iid  # 1-row blocks ignore the dependence: far too narrow


def test_regime_edges_from_training_rows_only_and_bins() -> None:
    rng = np.random.default_rng(1)
    n = 5000
    s, y = _dependent(n, 1.0, 5, rng)
    spread_train = rng.uniform(0, 1, 20_000)
    spread_valid = rng.uniform(0.5, 1.5, n)  # shifted: edges must not follow it
    unit = RowUnitData(
        labels={5: y}, regimes_valid={"spread": spread_valid}, regimes_train={"spread": spread_train}
    )
    rep = signal_report({("snap", "m"): _p(s)}, {"snap": unit}, SignalReportConfig(n_boot=20, n_perm=10))
    e = rep.regime_edges["snap"]["spread"]
    np.testing.assert_allclose(e, np.quantile(spread_train, [0.2, 0.4, 0.6, 0.8]))
    b = regime_bins(spread_valid, np.asarray(e))
    assert (b[spread_valid >= e[-1]] == 5).all() and (b[spread_valid < e[0]] == 1).all()
    for q in range(1, 6):
        c = rep.cell("snap", "m", 5, "spread", q)
        m = (b == q) & (y != 0)
        assert c.n == int(m.sum())
        if c.n:
            assert c.auc == pytest.approx(auc(_p(s)[m], y[m] > 0))
    assert rep.cell("snap", "m", 5, "spread", 5).n > rep.cell("snap", "m", 5, "spread", 1).n
    with pytest.raises(FxDataError, match="no finite training value"):
        regime_edges([np.nan], 5)


def test_models_and_row_units_side_by_side(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    s1, y1 = _dependent(3000, 1.0, 10, rng)
    s2, y2 = _dependent(900, 0.5, 3, rng)
    units = {"snapshot": RowUnitData(labels={10: y1, 20: y1}), "bar": RowUnitData(labels={10: y2, 20: y2})}
    noise = rng.standard_normal(3000)
    preds: dict[tuple[str, str], Predictions] = {
        ("snapshot", "mlp"): _p(s1),
        ("snapshot", "gbt"): {10: _p(s1 + noise), 20: _p(noise)},  # a per-horizon model
        ("bar", "mlp"): _p(s2),
    }
    rep = signal_report(preds, units, SignalReportConfig(n_boot=30, n_perm=20))
    assert set(rep.curves()) == set(preds)
    assert rep.block == 40  # block_factor 2 x longest horizon 20
    assert rep.cell("snapshot", "mlp", 10).auc > rep.cell("snapshot", "gbt", 10).auc > 0.55
    assert rep.cell("snapshot", "gbt", 20).in_null_band is True
    assert rep.cell("snapshot", "mlp", 10).in_null_band is False
    md = rep.markdown()
    assert "snapshot · gbt" in md and "bar · mlp" in md and "| 20 |" in md
    paths = rep.write(tmp_path)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cells" in paths["json"].read_text()
    with pytest.raises(FxDataError, match="shape"):
        signal_report({("bar", "x"): _p(s1)}, units)
    with pytest.raises(FxDataError, match="no labels"):
        signal_report({("tick", "x"): _p(s1)}, units)


def _market_report(
    snap_signal: float, horizons: list[int], tmp_path: Path | None = None, with_gbt: bool = False
) -> tuple[SignalReport, dict[int, float]]:
    """Report of the level-1-imbalance model ``P(up) = (1 + I1) / 2`` on the dense synthetic market:
    sessions 0-1 train (regime edges), 2-5 validation."""
    rows = front_rows(SynthConfig(snap_signal=snap_signal, **DENSE), 6)  # type: ignore[arg-type]
    tr = rows["session"] < 2
    n_train = int(tr.sum())
    br = sl.running_breaks(rows["session"])
    labels = sl.snapshot_labels(
        torch.from_numpy(rows["mid"]), 0.25, rows["mid"].size, sl.SnapshotLabelConfig(horizons=horizons), br
    )
    mid = rows["mid"]
    vol = np.abs(np.diff(mid, prepend=mid[0]))
    rv = np.convolve(vol, np.ones(100) / 100, mode="full")[: mid.size]  # trailing 100-row mean |dmid|
    ts = rows["ts"]
    dt100 = np.concatenate((np.full(100, np.nan), (ts[100:] - ts[:-100]) / 1e9))
    rate = 100.0 / np.maximum(dt100, 1e-9)  # updates per second over the last 100 rows
    regimes = {"spread": rows["spread"], "realised_vol": rv, "event_rate": rate}
    unit = RowUnitData(
        labels={lab.horizon: lab.classes.numpy()[n_train:] for lab in labels},
        zero_share={
            lab.horizon: float((ch == 0).sum() / np.isfinite(ch).sum())
            for lab in labels
            for ch in [lab.change.numpy()[n_train:]]
        },
        regimes_valid={k: v[n_train:] for k, v in regimes.items()},
        regimes_train={k: v[:n_train] for k, v in regimes.items()},
        clock_ns=sl.horizon_clock_ns(ts[n_train:], br[n_train:], horizons),
    )
    imb = rows["imb"][n_train:]
    preds: dict[tuple[str, str], Predictions] = {("snapshot", "imbalance"): (1.0 + imb) / 2.0}
    if with_gbt:
        # The corroborating model: LightGBM on (I1, spread, realised vol) fitted to the h = 50 labels.
        x = np.column_stack((rows["imb"], rows["spread"], rv))
        y50 = next(lab for lab in labels if lab.horizon == 50).classes.numpy()
        g = train_gbt(
            x[:n_train],
            y50[:n_train],
            x[n_train:],
            GbtConfig(
                sample_rows=20_000, stride=5, n_estimators=100, min_data_in_leaf=200, early_stopping_rounds=20
            ),
        )
        preds[("snapshot", "gbt")] = g.proba
    rep = signal_report(preds, {"snapshot": unit}, SignalReportConfig(n_boot=50, n_perm=100))
    if tmp_path is not None:
        rep.write(tmp_path)
    return rep, {c.horizon: c.auc for c in rep.curves()[("snapshot", "imbalance")]}


def test_decay_curve_of_the_planted_market_peaks_at_the_planted_horizon(tmp_path: Path) -> None:
    rep, a = _market_report(2.0, [1, 10, 20, 50, 100, 200, 500], tmp_path, with_gbt=True)
    peak = max(a, key=lambda h: a[h])
    assert peak in (20, 50), a
    g = {c.horizon: c.auc for c in rep.curves()[("snapshot", "gbt")]}
    assert max(g, key=lambda h: g[h]) in (20, 50), g  # the corroborating model sees the same peak
    assert g[50] > 0.58, g
    assert rep.cell("snapshot", "imbalance", 50, "event_rate", 3).n > 0
    assert (
        0 < rep.cell("snapshot", "imbalance", 50).clock_ns < rep.cell("snapshot", "imbalance", 500).clock_ns
    )
    c = rep.cell("snapshot", "imbalance", peak)
    assert c.auc_lo > 0.55 and c.in_null_band is False
    assert rep.cell("snapshot", "imbalance", 500).in_null_band is True, a
    assert (tmp_path / "signal_report.png").stat().st_size > 1000


def test_null_market_every_horizon_inside_the_null_band() -> None:
    # The snapshot_labels default horizons; h = 1-2 are left out: there the default book's own
    # mechanics give AUC ~0.51 one update ahead (docs/synthetic-market.md).
    rep, _a = _market_report(0.0, [10, 20, 50, 100, 500])
    for c in rep.curves()[("snapshot", "imbalance")]:
        assert c.in_null_band is True, (c.horizon, c.auc, c.null_sd)


def test_replicate_auc_equals_auc_of_the_resampled_rows() -> None:
    """The one-pass weighted AUC / accuracy equals metrics.auc on the rows repeated by their
    counts, ties included (scores on a coarse grid)."""
    from fx_assets.core.signal_report import _Prepared, block_starts, replicate_counts

    rng = np.random.default_rng(5)
    n = 3000
    s = np.round(rng.random(n), 1)  # many ties
    up = rng.random(n) < 0.3 + 0.4 * s
    rows = np.arange(n)
    pr = _Prepared.of(s, up, rows)
    a1, acc1 = pr.auc_acc(np.ones(n, dtype=np.int64))
    assert a1 == pytest.approx(auc(s, up)) and acc1 == pytest.approx(float(((s > 0.5) == up).mean()))
    st = block_starts(n, 70, 3, rng)
    for b in range(3):
        c = replicate_counts(st[b], n, 70)
        assert c.sum() == n
        idx = np.repeat(rows, c)
        a, acc = pr.auc_acc(c)
        assert a == pytest.approx(auc(s[idx], up[idx]))
        assert acc == pytest.approx(float(((s[idx] > 0.5) == up[idx]).mean()))


def test_replicates_scored_in_groups_equal_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap scores replicates in groups of columns (``BOOT_GROUP_BYTES``); any grouping
    gives every figure bit for bit: one replicate per group, groups of 4 with a short last one,
    and all replicates in one group."""
    import dataclasses

    from fx_assets.core import signal_report as SR

    rng = np.random.default_rng(9)
    s, y = _dependent(2000, 1.0, 10, rng)
    y = np.where(rng.random(2000) < 0.2, 0.0, y)  # stationary rows for the three-class figures
    units = {"snapshot": RowUnitData(labels={10: y, 20: y}, regimes_valid={"v": rng.random(2000)},
                                     regimes_train={"v": rng.random(500)})}  # fmt: skip
    proba = rng.dirichlet([1.0, 1.0, 1.0], 2000)
    preds: dict[tuple[str, str], Predictions] = {("snapshot", "m"): _p(s), ("snapshot", "p"): _p(s[::-1])}
    cfg = SignalReportConfig(n_boot=11, n_perm=10)

    def cells(group_bytes: int) -> list[tuple]:
        monkeypatch.setattr(SR, "BOOT_GROUP_BYTES", group_bytes)
        rep = SR.signal_report(preds, units, cfg, probabilities={("snapshot", "p"): proba})
        return [dataclasses.astuple(c) for c in rep.cells]

    one = cells(4 * 2000)  # G = 1
    for g in (4, 11):
        other = cells(4 * 2000 * g)
        assert len(other) == len(one)
        for a, b in zip(one, other, strict=True):
            assert all(x == z or (x != x and z != z) for x, z in zip(a, b, strict=True)), (a, b)
