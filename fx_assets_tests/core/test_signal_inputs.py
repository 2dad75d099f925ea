"""The signal report's per-fold inputs: bar labels never span a contract change, the decoded
training sample is capped, a fold's npz round-trips and stitches in time order, the chunk size
of the validation rows changes no number, and a trained model's predictions are used only when
they are row for row the report's rows."""

from pathlib import Path

import numpy as np
import pytest

from fx_assets.core.errors import FxDataError
from fx_assets.core.folds import FoldRange
from fx_assets.core.signal_inputs import (
    FoldSignal,
    SignalLabelConfig,
    _bar_labels,
    _training_rows,
    fold_signal,
    stitch_signals,
    trained_predictions,
)
from fx_assets.core.trainers.gbt import GbtConfig


def test_bar_labels_match_the_close_and_never_span_a_roll() -> None:
    close = np.array([100.0, 101.0, 101.0, 99.0, 50.0, 51.0, 52.0, 51.0])
    contract = np.array([1, 1, 1, 1, 2, 2, 2, 2], dtype=np.float64)
    lab = _bar_labels(close, contract, [1, 2], lag=1)
    ch1, c1 = lab[1]
    # y_j = ln C[j+2] - ln C[j+1]; j = 0: 101 -> 101 is a zero move (left out)
    assert np.isnan(c1[0]) and ch1[0] == 0.0
    assert c1[1] == -1.0  # 101 -> 99
    assert np.isnan(c1[2]) and np.isnan(c1[3])  # windows reach across the roll at row 4
    assert c1[4] == 1.0 and c1[5] == -1.0  # 51 -> 52, 52 -> 51
    assert np.isnan(c1[6:]).all()  # past the slice end
    ch2, c2 = lab[2]
    assert c2[0] == -1.0 and np.isnan(c2[1:4]).all()  # 101 -> 99; then across the roll
    assert ch2[4] == 0.0 and np.isnan(c2[4]) and np.isnan(ch2[5:]).all()  # 51 -> 51; past the end


def _fr(n_train: int) -> FoldRange:
    return FoldRange("2024-Q2", 0, n_train, n_train + 10, n_train + 20, 0, 0, 0, 0, 0, 0, 0)


def test_training_rows_are_strided_then_capped() -> None:
    cfg = GbtConfig(stride=3, sample_rows=100, early_stop_share=0.2)
    idx = _training_rows(_fr(3000), cfg)
    assert idx.size == 125 and (np.diff(idx) > 0).all() and (idx % 3 == 0).all()
    small = _training_rows(_fr(30), cfg)
    assert np.array_equal(small, np.arange(0, 30, 3))


def _signal(name: str, t0: int, n: int, seed: int) -> FoldSignal:
    rng = np.random.default_rng(seed)
    return FoldSignal(
        row_unit="snapshot",
        name=name,
        val_ts=np.arange(t0, t0 + n, dtype=np.int64),
        labels={10: rng.choice([-1.0, 1.0, np.nan], n)},
        n_zero={10: 3},
        n_defined={10: n},
        clock_ns={10: 1e6},
        regimes_valid={"spread": rng.random(n)},
        regimes_train={"spread": rng.random(2 * n)},
        predictions={"gbt": {10: rng.random(n)}},
        info={"gbt": {"10": {"n_fit": 5}}},
    )


def test_fold_signal_round_trip_and_stitch(tmp_path: Path) -> None:
    a, b = _signal("2024-Q2", 0, 50, 1), _signal("2024-Q3", 100, 40, 2)
    back = FoldSignal.load(a.save(tmp_path / "a.npz"))
    np.testing.assert_array_equal(back.labels[10], a.labels[10])
    np.testing.assert_array_equal(back.predictions["gbt"][10], a.predictions["gbt"][10])
    assert back.n_zero == a.n_zero and back.info == a.info and back.clock_ns == a.clock_ns
    st = stitch_signals([b, back])  # any order in, time order out
    assert st.name == "2024-Q2, 2024-Q3" and st.val_ts.size == 90 and (np.diff(st.val_ts) > 0).all()
    np.testing.assert_array_equal(st.labels[10], np.concatenate([a.labels[10], b.labels[10]]))
    assert st.regimes_train["spread"].size == 180
    assert abs(st.unit_data().zero_share[10] - 6 / 90) < 1e-12


# --- one fold read from fxcache files: chunked prediction, the trained model's rows -------------


def _bar_fold(tmp: Path, n_q: int = 1500, seed: int = 5) -> tuple[list[Path], FoldRange]:
    """Two quarters of bar rows whose next move follows the level-1 imbalance (a planted signal)."""
    from fx_assets.core.fxcache import write_fxcache

    rng = np.random.default_rng(seed)
    n = 2 * n_q
    imb = rng.uniform(-1.0, 1.0, n)
    # the label of row j (entry lag 1) is the move from close[j+1] to close[j+2]
    ret = np.concatenate([[0.0, 0.0], 2e-4 * imb[:-2]]) + 1e-4 * rng.standard_normal(n)
    close = 100.0 * np.exp(np.cumsum(ret))
    feats = np.column_stack(
        [rng.integers(1, 4, n), rng.random(n), rng.random(n) * 10.0, imb, rng.standard_normal(n)]
    )
    names = ["spread_ticks", "rv_20", "event_rate", "l1_imbalance", "noise"]
    ts = np.arange(n, dtype=np.int64) * 60_000_000_000
    paths = []
    for q in range(2):
        sl = slice(q * n_q, (q + 1) * n_q)
        paths.append(
            write_fxcache(
                tmp / f"q{q}.fxcache",
                ts[sl],
                {
                    "feature": (names, feats[sl]),
                    "price": (["close", "contract"], np.column_stack([close[sl], np.ones(n_q)])),
                },
                "f32",
                bytes([q]) * 32,
            )
        )
    return paths, FoldRange("2024-Q2", 0, n_q - 40, n_q, n, 40, 0, 0, 0, 0, 0, 0)


GBT_SMALL = GbtConfig(n_estimators=20, min_data_in_leaf=20, early_stopping_rounds=5, purge_rows=40)
BAR_LABELS = SignalLabelConfig(bar_horizons=[1, 5])


def test_chunk_size_changes_no_number(tmp_path: Path) -> None:
    paths, fr = _bar_fold(tmp_path)
    whole = fold_signal(paths, fr, BAR_LABELS, GBT_SMALL, tick=0.25, chunk_rows=fr.n_val)
    assert whole.val_ts.size == fr.n_val
    auc1 = _auc(whole.predictions["gbt"][1], whole.labels[1])
    assert auc1 > 0.6, auc1  # the plant is found: the predictions are real ones
    for chunk in (7, 333, fr.n_val + 1):
        part = fold_signal(paths, fr, BAR_LABELS, GBT_SMALL, tick=0.25, chunk_rows=chunk)
        for m, ph in whole.predictions.items():
            for h, p in ph.items():
                np.testing.assert_array_equal(part.predictions[m][h], p, err_msg=f"{chunk} {m} {h}")
        for k, v in whole.regimes_valid.items():
            np.testing.assert_array_equal(part.regimes_valid[k], v)
        for h, y in whole.labels.items():
            np.testing.assert_array_equal(part.labels[h], y)
    with pytest.raises(ValueError, match="chunk_rows"):
        fold_signal(paths, fr, BAR_LABELS, GBT_SMALL, tick=0.25, chunk_rows=0)


def _auc(p: np.ndarray, y: np.ndarray) -> float:
    from fx_assets.core.metrics import auc

    m = np.isfinite(y) & (y != 0)
    return float(auc(p[m], y[m] > 0))


def _val_predictions(path: Path, ts: np.ndarray, score: np.ndarray) -> Path:
    np.savez(path, ts=ts, score=score)
    return path


def test_trained_predictions_are_the_reports_rows_or_fail(tmp_path: Path) -> None:
    ts = np.arange(100, 150, dtype=np.int64)
    score = np.linspace(-3.0, 3.0, ts.size)
    f = _val_predictions(tmp_path / "v.npz", ts, score)
    np.testing.assert_array_equal(trained_predictions(f, ts, "mlp"), score)
    p = trained_predictions(f, ts, "dqn")  # Q(long) - Q(short) through the logistic function
    assert (np.diff(p) > 0).all() and ((p > 0.5) == (score > 0)).all()
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-score)), rtol=1e-14)
    for other in (ts[1:], ts + 1, np.concatenate([ts, [200]])):  # fewer, shifted, more rows
        with pytest.raises(FxDataError, match="not the report's"):
            trained_predictions(f, other, "mlp")
    bad = _val_predictions(tmp_path / "b.npz", ts, np.where(ts == 120, np.nan, score))
    with pytest.raises(FxDataError, match="non-finite"):
        trained_predictions(bad, ts, "mlp")


def test_a_model_is_stitched_only_where_every_fold_has_it(tmp_path: Path) -> None:
    a, b = _signal("2024-Q2", 0, 50, 1), _signal("2024-Q3", 100, 40, 2)
    a2 = a.with_model("trained_mlp", np.full(50, 0.7))
    assert a2.predictions["trained_mlp"][10].shape == (50,) and "trained_mlp" not in a.predictions
    back = FoldSignal.load(a2.save(tmp_path / "a.npz"))
    assert set(back.predictions) == {"gbt", "trained_mlp"}
    with pytest.raises(FxDataError, match="other horizons or models"):
        stitch_signals([back, b])
    st = stitch_signals([back.without_models(["gbt"]), b])
    assert set(st.predictions) == {"gbt"}
    with pytest.raises(FxDataError, match="predictions for"):
        a.with_model("m", np.zeros(3))


def test_rows_take_decodes_exactly_the_asked_columns(tmp_path: Path) -> None:
    from fx_assets.core.fxcache import write_fxcache
    from fx_assets.core.signal_inputs import _Rows

    rng = np.random.default_rng(0)
    paths = []
    for q, n in enumerate((300, 200)):
        paths.append(
            write_fxcache(
                tmp_path / f"q{q}.fxcache",
                np.arange(n, dtype=np.int64),
                {
                    "feature": (["f0", "f1", "f2"], rng.standard_normal((n, 3))),
                    "price": (["close", "contract"], np.column_stack([100 + rng.random(n), np.ones(n)])),
                    "ofi": (["ofi_0"], rng.standard_normal((n, 1))),
                },
                "bf16" if q else "f32",
                bytes([q]) * 32,
            )
        )
    rows = _Rows(paths)
    try:
        whole = np.concatenate([c.decoded() for c in rows.caches])
        idx = np.sort(rng.choice(500, size=120, replace=False))
        for names in (["close", "contract"], ["ofi_0", "f1", "close"], list(rows.all_names)):
            cols = [rows.all_names.index(n) for n in names]
            np.testing.assert_array_equal(rows.take(idx, names), whole[idx][:, cols])
    finally:
        rows.close()


# --- three-class models: class probabilities and the stationary label ---------------------------


def _proba(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet([1.0, 2.0, 1.0], n)


def test_class_probabilities_round_trip_stitch_and_drop(tmp_path: Path) -> None:
    a, b = _signal("2024-Q2", 0, 50, 1), _signal("2024-Q3", 100, 40, 2)
    pa, pb = _proba(50, 3), _proba(40, 4)
    a3 = a.with_model("trained_mlp", 0.5 * (1 + pa[:, 0] - pa[:, 2]), pa)
    b3 = b.with_model("trained_mlp", 0.5 * (1 + pb[:, 0] - pb[:, 2]), pb)
    assert set(a3.probabilities) == {"trained_mlp"} and not a.probabilities
    back = FoldSignal.load(a3.save(tmp_path / "a.npz"))
    np.testing.assert_array_equal(back.probabilities["trained_mlp"], pa)
    assert back.report_probabilities() == {("snapshot", "trained_mlp"): back.probabilities["trained_mlp"]}
    st = stitch_signals([b3, back])
    np.testing.assert_array_equal(st.probabilities["trained_mlp"], np.concatenate([pa, pb]))
    # a binary model under the same name in one fold: refused, not stitched half three-class
    b2 = b.with_model("trained_mlp", np.full(40, 0.5))
    with pytest.raises(FxDataError, match="class probabilities"):
        stitch_signals([back, b2])
    assert not back.without_models(["gbt"]).probabilities
    assert not a3.with_model("trained_mlp", np.full(50, 0.5)).probabilities  # replaced by a binary one
    with pytest.raises(FxDataError, match="class probabilities of shape"):
        a.with_model("m", np.full(50, 0.5), pa[:, :2])
    # an old fold file (no proba) loads with none
    assert FoldSignal.load(a.save(tmp_path / "old.npz")).probabilities == {}


def test_trained_probabilities_are_the_reports_rows_or_fail(tmp_path: Path) -> None:
    from fx_assets.core.signal_inputs import trained_probabilities

    ts = np.arange(100, 150, dtype=np.int64)
    p = _proba(ts.size, 5)
    score = 0.5 * (1 + p[:, 0] - p[:, 2])
    f = tmp_path / "v.npz"
    np.savez(f, ts=ts, score=score, proba=p)
    got = trained_probabilities(f, ts)
    assert got is not None
    np.testing.assert_array_equal(got, p)
    assert trained_probabilities(_val_predictions(tmp_path / "bin.npz", ts, score), ts) is None
    with pytest.raises(FxDataError, match="not the report's"):
        trained_probabilities(f, ts[1:])
    bad = p.copy()
    bad[7] = [0.5, 0.5, 0.5]
    np.savez(tmp_path / "bad.npz", ts=ts, score=score, proba=bad)
    with pytest.raises(FxDataError, match="row 7"):
        trained_probabilities(tmp_path / "bad.npz", ts)


def _snapshot_fold(tmp: Path, n_q: int = 1200, seed: int = 6) -> tuple[list[Path], FoldRange]:
    """Two quarters of snapshot rows whose mid (on the 0.125 half-tick grid) mostly stands still."""
    from fx_assets.core.fxcache import write_fxcache

    rng = np.random.default_rng(seed)
    n = 2 * n_q
    imb = rng.uniform(-1.0, 1.0, n)
    prev = np.concatenate([[0.0], imb[:-1]])  # the move into row i follows row i-1's imbalance
    step = np.where(rng.random(n) < 0.6, 0, np.where(rng.random(n) < 0.5 + 0.4 * prev, 1, -1))
    mid = 4000.0 + 0.125 * np.cumsum(step)
    feats = np.column_stack([rng.integers(1, 4, n), rng.random(n), rng.random(n) * 3, imb])
    names = ["book_spread_ticks", "bar_rv_20", "log_event_rate_hz", "book_l1_imbalance"]
    ts = np.arange(n, dtype=np.int64) * 1_000_000
    paths = []
    for q in range(2):
        sl = slice(q * n_q, (q + 1) * n_q)
        px = np.column_stack([mid[sl], np.ones(n_q), np.full(n_q, 19_800.0 + q)])
        paths.append(
            write_fxcache(
                tmp / f"s{q}.fxcache",
                ts[sl],
                {"feature": (names, feats[sl]), "price": (["mid", "contract", "session"], px)},
                "f32",
                bytes([q + 7]) * 32,
                {"row_unit": "snapshot"},
            )
        )
    return paths, FoldRange("2024-Q2", 0, n_q - 40, n_q, n, 40, 0, 0, 0, 0, 0, 0)


def test_snapshot_validation_labels_keep_a_zero_move_as_stationary(tmp_path: Path) -> None:
    """The report's validation labels of snapshot rows are +1 / -1 / 0 (zero move) / NaN, each
    the sign of the mid's move h rows ahead in the validation slice (on main a zero move was NaN);
    the GBT, fitted on up against down, still finds the planted imbalance."""
    paths, fr = _snapshot_fold(tmp_path)
    cfg = SignalLabelConfig(snapshot_horizons=[1, 5])
    sig = fold_signal(paths, fr, cfg, GBT_SMALL, tick=0.25)
    from fx_assets.core.signal_inputs import _Rows

    rows = _Rows(paths)
    try:
        vmid = rows.take(np.arange(fr.val_start, fr.val_end), ["mid"])[:, 0]
    finally:
        rows.close()
    for h in (1, 5):
        y = sig.labels[h]
        move = np.full(vmid.size, np.nan)
        move[:-h] = np.sign(vmid[h:] - vmid[:-h])
        np.testing.assert_array_equal(y, move)
        zero = int((y == 0).sum())
        assert zero > 0.2 * y.size and zero == sig.n_zero[h]
    auc1 = _auc(sig.predictions["gbt"][1], sig.labels[1])
    assert auc1 > 0.6, auc1  # the GBT found the planted imbalance
