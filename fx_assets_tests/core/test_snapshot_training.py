"""Training on snapshot rows (one row per book update): the fold transition's labels are
``core.snapshot_labels`` of the exact mid, never across a session or contract break, with the
purge of the label reach; the MLP finds a planted event-time signal and not a null one; the DQN
runs on the same fold."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from fx_assets.core.device_store import DeviceSlice, DeviceStore
from fx_assets.core.errors import FxDataError
from fx_assets.core.snapshot_labels import running_breaks, snapshot_labels
from fx_assets.core.trainers.common import TrainConfig
from fx_assets.core.trainers.dqn import train_dqn
from fx_assets.core.trainers.mlp import train_mlp
from fx_assets.core.trainers.transition import fold_transition

TICK = 0.25
T0 = 1_704_153_600_000_000_000  # 2024-01-02 00:00 UTC


class Range(NamedTuple):
    train_start: int
    train_end: int
    val_start: int
    val_end: int


def _market(n: int, signal: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, features [n, 3], prices [n, 3] mid/session/contract): a half-tick mid whose next
    moves lean with ``signal`` on an observable slow state ``s`` (feature 0); four sessions and
    one contract change, so labels must stop at breaks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    s = np.zeros(n)
    a = 1.0 - 1.0 / 30.0
    for i in range(1, n):
        s[i] = a * s[i - 1] + x[i] * (1 - a) ** 0.5 * 3
    p_up = 0.5 + signal * 0.35 * np.tanh(s)
    move = rng.random(n) < 0.25  # most updates leave the mid unchanged (zero moves)
    step = np.where(move, np.where(rng.random(n) < np.roll(p_up, 1), 1, -1), 0)
    step[0] = 0
    mid = (2 * 5000 / TICK + np.cumsum(step)) * (TICK / 2)
    session = np.repeat(np.arange(4, dtype=np.float64) + 19724, -(-n // 4))[:n]
    contract = np.where(np.arange(n) < n * 5 // 8, 1.0, 2.0)
    ts = T0 + np.arange(n, dtype=np.int64) * 1_000_000
    feats = np.stack([s, rng.standard_normal(n), np.abs(x)], axis=1)
    return ts, feats, np.stack([mid, session, contract], axis=1)


def _slice(signal: float, n: int = 40_000, seed: int = 0) -> DeviceSlice:
    ts, feats, prices = _market(n, signal, seed)
    st = DeviceStore(device="cpu", price_tick=TICK)
    st.add_quarter(
        "S", ts, feats, ["s", "noise", "absx"], price_columns=["mid", "session", "contract"],
        prices=prices, row_unit="snapshot",
    )  # fmt: skip
    return st.concat_view(["S"])


def _cfg(**kw: object) -> TrainConfig:
    base: dict[str, object] = {
        "trainer": "mlp", "row_unit": "snapshot", "epochs": 3, "batch_size": 512, "hidden": [16],
        "snapshot_horizons": [10, 50, 200], "train_horizon": 50, "patience": 2,
    }  # fmt: skip
    base.update(kw)
    return TrainConfig.model_validate(base)


def _range(view: DeviceSlice, cfg: TrainConfig) -> Range:
    n = view.n_rows
    te = int(n * 0.7)
    return Range(0, te, te + cfg.purge_bars, n)


@pytest.mark.parametrize("form", ["unsmoothed", "tlob"])
@pytest.mark.parametrize("zero", ["exclude", "three_class"])
def test_fold_labels_are_the_snapshot_labels_of_the_exact_mid(form: str, zero: str) -> None:
    view = _slice(1.0, n=8000)
    cfg = _cfg(
        snapshot_form=form, snapshot_zero=zero, snapshot_stationary_share=0.3 if form == "tlob" else None
    )
    fr = _range(view, cfg)
    fd = fold_transition(view, fr, cfg)
    px = view.prices.numpy()
    rows = slice(fr.train_start, fr.val_end)
    brk = running_breaks(px[rows, 1], px[rows, 2])
    n_tr = fr.train_end - fr.train_start
    ref = snapshot_labels(torch.from_numpy(px[rows, 0].copy()), TICK, n_tr, cfg.snapshot_labels(), brk)
    main = next(h for h in ref if h.horizon == 50)
    v0 = fr.val_start - fr.train_start
    both = torch.cat([fd.y_train, fd.y_val])
    want = torch.cat([main.classes[:n_tr], main.classes[v0:]])
    assert torch.equal(both.isnan(), want.isnan())
    assert torch.equal(both.nan_to_num(7.0), want.nan_to_num(7.0))  # bit for bit
    assert fd.extra["zero_move_share"] == main.shares["stationary"] > 0.02
    assert (zero == "exclude") == (not bool((fd.y_train == 0).any()))
    for h in ref:
        assert torch.equal(fd.extra["classes"][h.horizon].nan_to_num(7.0), h.classes.nan_to_num(7.0))
    # no label spans a break: the rows whose 50-row window meets a session or contract change
    # are undefined
    idx = np.arange(n_tr)
    spans = brk[np.minimum(idx + 50, brk.size - 1)] != brk[idx]
    assert bool(torch.isnan(fd.y_train[torch.from_numpy(spans)]).all())
    assert fd.horizons == (50,) and fd.extra["row_unit"] == "snapshot"


def test_purge_and_row_unit_are_checked() -> None:
    view = _slice(1.0, n=4000)
    cfg = _cfg()
    fr = _range(view, cfg)
    with pytest.raises(FxDataError, match="label reach"):
        fold_transition(view, Range(0, fr.train_end, fr.train_end + cfg.purge_bars - 1, fr.val_end), cfg)
    with pytest.raises(FxDataError, match="'snapshot' rows, the trainer config expects 'bar'"):
        fold_transition(view, fr, _cfg(row_unit="bar"))


def test_mlp_finds_the_planted_signal_and_not_a_null_one(tmp_path: Path) -> None:
    cfg = _cfg(epochs=4)
    out = {}
    for name, signal in (("planted", 1.0), ("null", 0.0)):
        view = _slice(signal, n=40_000, seed=5)
        fd = fold_transition(view, _range(view, cfg), cfg)
        res = train_mlp(fd, cfg, tmp_path / name, ["S"])
        out[name] = res.metrics
    assert out["planted"]["auc"] > 0.6 and out["planted"]["auc_null_z"] > 5, out["planted"]
    assert abs(out["null"]["auc_null_z"]) < 4, out["null"]


def test_dqn_trains_on_a_snapshot_fold(tmp_path: Path) -> None:
    cfg = _cfg(trainer="dqn", epochs=1, n_envs=16, episode_len=64, learn_starts=64, replay_size=4096)
    view = _slice(1.0, n=8000)
    fd = fold_transition(view, _range(view, cfg), cfg)
    res = train_dqn(fd, cfg, tmp_path / "dqn", ["S"])
    assert np.isfinite(res.metrics["sharpe"]) or np.isnan(res.metrics["sharpe"])
    assert res.val_positions.shape[0] == fd.x_val.shape[0]


def _snapshot_files(tmp_path: Path, signal: float, n: int, seed: int = 0) -> tuple[list[Path], DeviceSlice]:
    """Two snapshot-row fxcache files of one market (rows split at n // 2) and their resident view."""
    from fx_assets.core.fxcache import write_fxcache

    ts, feats, prices = _market(n, signal, seed)
    paths = []
    for i, (a, b) in enumerate(((0, n // 2), (n // 2, n))):
        paths.append(
            write_fxcache(
                tmp_path / f"s{i}.fxcache",
                ts[a:b],
                {
                    "feature": (["s", "noise", "absx"], feats[a:b]),
                    "price": (["mid", "session", "contract"], prices[a:b]),
                },
                "f32",
                bytes([i]) * 32,
                {"row_unit": "snapshot"},
            )
        )
    st = DeviceStore(device="cpu", price_tick=TICK)
    st.add_fxcaches([(f"S{i}", p) for i, p in enumerate(paths)])
    return paths, st.concat_view(["S0", "S1"])


@pytest.mark.parametrize("block_rows", [37, 1000])
@pytest.mark.parametrize(
    "form,share,zero",
    [
        ("unsmoothed", None, "exclude"),
        ("fi", 0.4, "three_class"),
        ("deeplob", None, "three_class"),
        ("deeplob", 0.3, "exclude"),
        ("tlob", None, "exclude"),
        ("tlob", 0.6, "three_class"),
    ],
)
def test_streamed_snapshot_fold_equals_the_resident_one(
    tmp_path: Path, block_rows: int, form: str, share: float | None, zero: str
) -> None:
    """Every label form, with and without a fitted dead band: blocks shorter than the 201-row
    reach (and than deeplob's 200-row look-back) cut through the session breaks and the
    contract roll, so a block's labels need the rows of the blocks before and after it (the
    halo); they equal the resident labels bit for bit, as do the inputs, every horizon's
    validation classes, the dead bands and the zero-move share."""
    from fx_assets.core.fold_stream import StreamedRows
    from fx_assets.core.trainers.rows import ResidentRows

    cfg = _cfg(snapshot_form=form, snapshot_stationary_share=share, snapshot_zero=zero, snapshot_smooth=7)
    paths, view = _snapshot_files(tmp_path, 1.0, 6000)
    fr = _range(view, cfg)
    ref = fold_transition(view, fr, cfg)
    sr = StreamedRows(paths, fr, cfg, block_rows=block_rows, device="cpu", price_tick=TICK)
    res = ResidentRows(ref, block_rows)
    for part in ("train", "val"):
        n = sr.part_rows(part)
        for name in ("y", "r1", "x"):
            a = torch.cat([getattr(b, name) for b in sr.block_list(part, 0, n)])
            b_ = torch.cat([getattr(b, name) for b in res.block_list(part, 0, n)])
            assert torch.equal(a.nan_to_num(7.0), b_.nan_to_num(7.0)), (part, name)
    y = torch.cat([ref.y_train, ref.y_val])
    assert bool(torch.isfinite(y).any()) and bool(torch.isnan(y).any())  # labels and breaks both seen
    if zero == "three_class":
        assert bool((ref.y_train == 0).any())
    assert sr.extra["zero_move_share"] == ref.extra["zero_move_share"]
    assert sr.extra["train_labels_undefined"] == ref.extra["train_labels_undefined"] > 0
    assert sr.extra["alpha"] == ref.extra["alpha"] and sr.extra["horizon_alpha"] == ref.extra["horizon_alpha"]
    assert (share is None) == (ref.extra["alpha"] == 0.0)
    n_val = fr.val_end - fr.val_start
    got = sr.val_classes()
    for h, cls in ref.extra["classes"].items():
        assert torch.equal(got[h].nan_to_num(7.0), cls[-n_val:].nan_to_num(7.0)), h
    sr.close()


def test_mlp_and_dqn_train_on_a_streamed_snapshot_fold(tmp_path: Path) -> None:
    from fx_assets.core.fold_stream import StreamedRows

    cfg = _cfg(epochs=2, block_rows=4096)
    paths, view = _snapshot_files(tmp_path, 1.0, 20_000, seed=5)
    fr = _range(view, cfg)
    sr = StreamedRows(paths, fr, cfg, block_rows=4096, device="cpu", price_tick=TICK)
    res = train_mlp(sr, cfg, tmp_path / "mlp", ["S0", "S1"])
    assert res.metrics["auc"] > 0.6
    sr.close()
    dcfg = _cfg(
        trainer="dqn", epochs=1, n_envs=16, episode_len=64, learn_starts=64, replay_size=4096, block_rows=4096
    )
    sr = StreamedRows(paths, fr, dcfg, block_rows=4096, device="cpu", price_tick=TICK)
    d = train_dqn(sr, dcfg, tmp_path / "dqn", ["S0", "S1"])
    assert d.val_positions.shape[0] == fr.val_end - fr.val_start
    sr.close()


def test_three_class_mlp_fits_up_stationary_down(tmp_path: Path) -> None:
    """``snapshot_zero='three_class'``: a 3-way softmax fitted on every defined class (the
    stationary rows included); its score (1 + P(up) − P(down)) / 2 finds the planted signal
    (AUC of up against down), its P(stationary) tracks the stationary share, and the checkpoint
    rebuilds the same model."""
    from fx_assets.core.trainers.common import load_state
    from fx_assets.core.trainers.mlp import build_mlp, predict_classes, predict_proba, three_class_score

    cfg = _cfg(epochs=3, snapshot_zero="three_class", snapshot_stationary_share=0.4)
    assert cfg.three_class and not _cfg().three_class
    view = _slice(1.0, n=40_000, seed=5)
    fd = fold_transition(view, _range(view, cfg), cfg)
    assert bool((fd.y_train == 0).any())
    res = train_mlp(fd, cfg, tmp_path / "m3", ["S"])
    assert res.val_proba is not None and res.val_scores is not None
    pr = res.val_proba
    assert pr.shape == (fd.x_val.shape[0], 3)
    np.testing.assert_allclose(pr.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(res.val_scores, three_class_score(torch.from_numpy(pr)).numpy())
    assert res.metrics["auc"] > 0.6 and res.metrics["auc_null_z"] > 5, res.metrics
    y = fd.y_val.numpy()
    share0 = float((y[np.isfinite(y)] == 0).mean())
    assert 0.2 < share0 < 0.7 and abs(float(pr[:, 1].mean()) - share0) < 0.1, (share0, pr[:, 1].mean())
    import json

    side = json.loads(res.sidecar_path.read_text())
    assert side["architecture"]["out_dim"] == 3 and side["architecture"]["classes"] == [
        "up",
        "stationary",
        "down",
    ]
    model = build_mlp(side["architecture"])
    model.load_state_dict(load_state(res.best_path))
    np.testing.assert_array_equal(predict_classes(model, fd.x_val).double().numpy(), pr)
    np.testing.assert_array_equal(predict_proba(model, fd.x_val).numpy(), res.val_scores)
    # the binary MLP on the same fold is untouched: one output, no probabilities
    b = train_mlp(fd, cfg.model_copy(update={"snapshot_zero": "exclude"}), tmp_path / "m2", ["S"])
    assert b.val_proba is None and "out_dim" not in json.loads(b.sidecar_path.read_text())["architecture"]


def test_dqn_refuses_three_class() -> None:
    with pytest.raises(ValueError, match="snapshot_zero='three_class' is for the MLP"):
        _cfg(trainer="dqn", snapshot_zero="three_class")


def test_three_class_mlp_trains_the_same_streamed_and_resident(tmp_path: Path) -> None:
    """Equal blocks give the same three-class training bit for bit, resident or streamed (with a
    smoothed form and a fitted dead band, which stream since the halo and the streamed fit)."""
    from fx_assets.core.fold_stream import StreamedRows
    from fx_assets.core.trainers.rows import ResidentRows

    cfg = _cfg(
        epochs=2, block_rows=1500, snapshot_zero="three_class", snapshot_form="tlob",
        snapshot_stationary_share=0.3, deterministic=True,
    )  # fmt: skip
    paths, view = _snapshot_files(tmp_path, 1.0, 8000, seed=5)
    fr = _range(view, cfg)
    fd = fold_transition(view, fr, cfg)
    a = train_mlp(ResidentRows(fd, 1500), cfg, tmp_path / "r", ["S0", "S1"])
    sr = StreamedRows(paths, fr, cfg, block_rows=1500, device="cpu", price_tick=TICK, stats=(fd.mean, fd.std))
    b = train_mlp(sr, cfg, tmp_path / "s", ["S0", "S1"])
    sr.close()
    assert a.val_proba is not None and b.val_proba is not None
    np.testing.assert_array_equal(a.val_proba, b.val_proba)
    np.testing.assert_array_equal(a.val_scores, b.val_scores)
