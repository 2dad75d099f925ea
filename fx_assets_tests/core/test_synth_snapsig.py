"""The planted snapshot-horizon signal of the synthetic market (``SynthConfig.snap_signal``).

On a dense book feed (many updates per latent second), the level-1 queue imbalance of an update
predicts the sign of the front mid move h updates ahead (labels: ``core.snapshot_labels``) with an
AUC that peaks at the planted horizon (the response peaks ~42 updates after the imbalance) and
is back near 0.5 by 500; with the plant off (``--null``) it is ~0.5 at every horizon >= 10.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import databento as db
import numpy as np
import torch

from fx_assets.core import snapshot_labels as sl
from fx_assets.core.metrics import auc
from fx_assets.core.synth import SynthConfig, generate_market, iter_quarter_records

Q = dt.date(2024, 4, 1)
HORIZONS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
DENSE = {"quarters": (Q,), "scale": 0.002, "seed": 3, "book_ratio": 50.0}


def front_rows(cfg: SynthConfig, n_sessions: int) -> dict[str, np.ndarray]:
    """mid (f64, index points), spread (index points), level-1 imbalance, session id and ts_recv
    (ns) of the front outright's book records over the quarter's first ``n_sessions`` sessions."""
    plan, sessions = iter_quarter_records(cfg, "ES.FUT", cfg.quarters[0])
    mids, imbs, sess, spreads, ts = [], [], [], [], []
    for sr in sessions:
        if sr.index >= n_sessions:
            break
        b = np.concatenate(list(sr.book_chunks))
        b = b[b["instrument_id"] == plan.ids[0 if sr.index < plan.roll_index else 1]]
        q = b["bid_sz_00"].astype(np.float64) + b["ask_sz_00"]
        imbs.append((b["bid_sz_00"].astype(np.float64) - b["ask_sz_00"]) / q)
        mids.append((b["bid_px_00"].astype(np.float64) + b["ask_px_00"]) / 2e9)
        spreads.append((b["ask_px_00"].astype(np.float64) - b["bid_px_00"]) / 1e9)
        ts.append(b["ts_recv"].astype(np.int64))
        sess.append(np.full(b.size, sr.index))
    return {
        "mid": np.concatenate(mids),
        "spread": np.concatenate(spreads),
        "imb": np.concatenate(imbs),
        "session": np.concatenate(sess),
        "ts": np.concatenate(ts),
    }


def imbalance_auc(rows: dict[str, np.ndarray], horizons: tuple[int, ...] = HORIZONS) -> dict[int, float]:
    """AUC of the level-1 imbalance for an up move h updates ahead (zero moves excluded)."""
    labels = sl.snapshot_labels(
        torch.from_numpy(rows["mid"]),
        0.25,
        rows["mid"].size,
        sl.SnapshotLabelConfig(horizons=list(horizons)),
        sl.running_breaks(rows["session"]),
    )
    out = {}
    for lab in labels:
        c = lab.classes.numpy()
        keep = np.isfinite(c)
        out[lab.horizon] = auc(rows["imb"][keep], c[keep] > 0)
    return out


def test_planted_signal_peaks_at_its_horizon_and_is_gone_by_500() -> None:
    a = imbalance_auc(front_rows(SynthConfig(snap_signal=2.0, **DENSE), 4))  # type: ignore[arg-type]
    peak = max(a, key=lambda h: a[h])
    assert peak in (20, 50), a
    assert a[peak] > 0.6, a
    assert a[10] < a[20] and a[100] < a[50] and a[200] < a[100], a
    assert abs(a[500] - 0.5) < 0.02, a


def test_null_market_has_no_imbalance_signal() -> None:
    a = imbalance_auc(front_rows(SynthConfig(snap_signal=0.0, **DENSE), 4))  # type: ignore[arg-type]
    # h < 10 is left out: the default book's own mechanics give AUC ~0.51 one update ahead (a touch
    # move leaves a fresh level-1 queue against the move; the tick-rounded latent mid bounces).
    for h in HORIZONS:
        if h >= 10:
            assert abs(a[h] - 0.5) < 0.02, (h, a)


def test_plant_off_is_the_default_market_bit_for_bit(tmp_path: Path) -> None:
    base = {"quarters": (Q,), "scale": 0.0005, "seed": 4, "book_ratio": 2.0}
    generate_market(tmp_path / "a", SynthConfig(**base))  # type: ignore[arg-type]
    generate_market(tmp_path / "b", SynthConfig(snap_signal=0.0, **base))  # type: ignore[arg-type]
    rep = generate_market(tmp_path / "c", SynthConfig(snap_signal=3.0, **base))  # type: ignore[arg-type]
    # The plant translates prices only: sizes and counts are the default market's, and every
    # price of a record (both sides, all levels) moves by one D, which changes at no T record.
    b0 = db.DBNStore.from_file(tmp_path / "a/raw/mbp-10/ES.FUT/ES.FUT_2024-Q2.dbn.zst").to_ndarray()
    b3 = db.DBNStore.from_file(rep.quarters[0].mbp10_path).to_ndarray()
    assert b0.size == b3.size
    for k in range(10):
        for f in ("bid_sz", "ask_sz", "bid_ct", "ask_ct"):
            np.testing.assert_array_equal(b0[f"{f}_{k:02d}"], b3[f"{f}_{k:02d}"])
    shift = (b3["bid_px_00"] - b0["bid_px_00"]) // 250_000_000
    for k in range(10):
        np.testing.assert_array_equal((b3[f"ask_px_{k:02d}"] - b0[f"ask_px_{k:02d}"]) // 250_000_000, shift)
    np.testing.assert_array_equal((b3["price"] - b0["price"]) // 250_000_000, shift)
    assert np.abs(shift).max() > 0
    for iid in np.unique(b3["instrument_id"]):
        sh, act = shift[b3["instrument_id"] == iid], b3["action"][b3["instrument_id"] == iid]
        at_t = np.flatnonzero(act == b"T")
        at_t = at_t[at_t > 0]
        np.testing.assert_array_equal(sh[at_t], sh[at_t - 1])
    for rel in ("raw/trades/ES.FUT/ES.FUT_2024-Q2.dbn.zst", "raw/mbp-10/ES.FUT/ES.FUT_2024-Q2.dbn.zst"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
        assert (tmp_path / "a" / rel).read_bytes() != (tmp_path / "c" / rel).read_bytes()
    assert (tmp_path / "a/raw/synth_manifest.json").read_text().count("snap") == 0
    # With the plant on, trades still print at the book they met and match their T records.
    t = db.DBNStore.from_file(rep.quarters[0].trades_path).to_ndarray()
    b = db.DBNStore.from_file(rep.quarters[0].mbp10_path).to_ndarray()
    ids = list(rep.quarters[0].contracts.values())[:2]
    outr = np.isin(t["instrument_id"], ids)
    bt = b[b["action"] == b"T"]
    for f in ("ts_recv", "instrument_id", "price", "size", "side", "sequence"):
        np.testing.assert_array_equal(bt[f], t[outr][f], err_msg=f)
    for iid in ids:
        bi = b[b["instrument_id"] == iid]
        is_t = np.flatnonzero(bi["action"] == b"T")
        is_t = is_t[is_t > 0]
        prev = bi[is_t - 1]
        expected = np.where(bi["side"][is_t] == b"B", prev["ask_px_00"], prev["bid_px_00"])
        np.testing.assert_array_equal(bi["price"][is_t], expected)
        assert (bi["bid_px_00"] < bi["ask_px_00"]).all()


def test_cli_snap_signal_and_null(tmp_path: Path) -> None:
    from fx_assets.cli import main

    rc = main(
        ["synth", "--out", str(tmp_path / "n"), "--quarters", "2024-Q2", "--null", "--snap-signal", "1"]
    )
    assert rc == 2
    assert not (tmp_path / "n" / "raw").exists()
    args = [
        "synth",
        "--out",
        str(tmp_path / "s"),
        "--quarters",
        "2024-Q2",
        "--scale",
        "0.0003",
        "--book-ratio",
        "1",
    ]
    assert main([*args, "--snap-signal", "1.5"]) == 0
    man = json.loads((tmp_path / "s/raw/synth_manifest.json").read_text())
    assert man["config"]["snap_signal"] == 1.5 and man["signal"]["null"] is False
    assert "level-1 queue imbalance" in man["signal"]["snap_description"]
    assert (
        main(
            [
                "synth",
                "--out",
                str(tmp_path / "d"),
                "--quarters",
                "2024-Q2",
                "--scale",
                "0.0003",
                "--book-ratio",
                "1",
                "--null",
            ]
        )
        == 0
    )
    man0 = json.loads((tmp_path / "d/raw/synth_manifest.json").read_text())
    assert "snap_signal" not in man0["config"] and man0["signal"]["null"] is True
