"""The signal report's per-fold inputs: bar labels never span a contract change, the decoded
training sample is capped, and a fold's npz round-trips and stitches in time order."""

from pathlib import Path

import numpy as np

from fx_assets.core.folds import FoldRange
from fx_assets.core.signal_inputs import FoldSignal, _bar_labels, _training_rows, stitch_signals
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
