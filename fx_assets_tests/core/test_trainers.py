"""Fold transition, MLP and DQN trainers: normalisation scope, labels, determinism, checkpoints and
the end-to-end honesty checks (planted signal found, null market and shuffled labels not)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fx_assets.core import calendar, labels
from fx_assets.core.device_store import DeviceStore
from fx_assets.core.errors import FxDataError
from fx_assets.core.folds import FoldConfig, FoldRange, fold_range
from fx_assets.core.trainers import FoldData, TrainConfig, fold_transition, train_dqn, train_mlp
from fx_assets.core.trainers.common import load_state
from fx_assets.core.trainers.dqn import build_qnet, greedy_table, resolve_positions
from fx_assets.core.trainers.mlp import band_positions, build_mlp, predict_proba

QUARTER_BARS = 3000
N_NOISE = 15
INPUTS = ["sig", *[f"n{i}" for i in range(N_NOISE - 1)], "ofi_0"]
COLUMNS = ["open", "close", *INPUTS]
SIGMA = 1e-3  # per-bar log-return std


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Tiny nets on a shared 2-core box: intra-op threads only contend (epochs vary 0.2 s to 20 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _bar_times(n: int) -> np.ndarray:
    """5-minute bar closes inside Globex sessions from 2024-01-02 on."""
    t0 = int(dt.datetime(2024, 1, 2, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
    grid = t0 + np.arange(2 * n, dtype=np.int64) * 300 * 1_000_000_000
    return grid[calendar.session_day(grid) >= 0][:n]


def make_market(n_quarters: int, signal: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ts [n], values [n, 2 + 16] float64). ``sig`` at bar t drives ln C[t+2] − ln C[t+1] with
    correlation ``signal``; everything else is noise. signal=0 is the null market."""
    rng = np.random.default_rng(seed)
    n = n_quarters * QUARTER_BARS
    ts = _bar_times(n)
    x = rng.standard_normal((n, len(INPUTS)))
    rho = np.empty(n)  # rho[k] = ln C[k] − ln C[k−1]
    eps = rng.standard_normal(n)
    rho[:2] = SIGMA * eps[:2]
    rho[2:] = SIGMA * (signal * x[:-2, 0] + math.sqrt(1 - signal**2) * eps[2:])
    close = 5000.0 * np.exp(np.cumsum(rho))
    openp = np.concatenate([[5000.0], close[:-1]])
    values = np.column_stack([openp, close, x])
    return ts, values


def load_store(
    ts: np.ndarray, values: np.ndarray, n_quarters: int, **kw: object
) -> tuple[DeviceStore, list[str]]:
    kw.setdefault("device", "cpu")
    store = DeviceStore(**kw)  # type: ignore[arg-type]
    keys = [f"2024-Q{i + 1}" for i in range(n_quarters)]
    for i, k in enumerate(keys):
        sl = slice(i * QUARTER_BARS, (i + 1) * QUARTER_BARS)
        store.add_quarter(k, ts[sl], values[sl], COLUMNS)
    return store, keys


def make_range(ts: np.ndarray, n_quarters: int, val_q: int, train_q: int = 2) -> FoldRange:
    starts = [int(ts[i * QUARTER_BARS]) for i in range(n_quarters)]
    cfg = FoldConfig(train_quarters=train_q, purge_bars=labels.max_horizon(), warmup_bars=0)
    return fold_range(ts, starts, val_q, cfg, name=f"q{val_q}")


def build_fold(signal: float, seed: int, cfg: TrainConfig) -> tuple[FoldData, np.ndarray, np.ndarray]:
    ts, values = make_market(3, signal, seed)
    store, keys = load_store(ts, values, 3)
    view = store.concat_view(keys)
    return fold_transition(view, make_range(ts, 3, 2), cfg), ts, values


MLP_CFG = TrainConfig(
    trainer="mlp", seed=3, epochs=6, batch_size=256, lr=3e-3, hidden=(16,), patience=3, cost=5e-5
)
DQN_CFG = TrainConfig(
    trainer="dqn",
    seed=5,
    epochs=4,
    batch_size=256,
    lr=3e-3,
    hidden=(32,),
    patience=3,
    cost=5e-5,
    gamma=0.5,
    tau=0.02,
    n_envs=64,
    episode_len=128,
    learn_starts=512,
    eps_decay_steps=600,
    max_steps_per_epoch=250,
    replay_size=20_000,
)


@pytest.fixture(scope="module")
def signal_fold() -> FoldData:
    return build_fold(0.35, 11, MLP_CFG)[0]


@pytest.fixture(scope="module")
def null_fold() -> FoldData:
    return build_fold(0.0, 12, MLP_CFG)[0]


# ------------------------------------------------------------------------------- fold transition
def test_norm_stats_from_training_rows_only_and_match_numpy() -> None:
    ts, values = make_market(3, 0.35, 1)
    store, keys = load_store(ts, values, 3)
    fr = make_range(ts, 3, 2)
    fold = fold_transition(store.concat_view(keys), fr, MLP_CFG)
    assert fold.columns == tuple(INPUTS)  # price columns never inputs
    train = values[fr.train_start : fr.train_end, 2:].astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(fold.mean.numpy(), train.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fold.std.numpy(), train.std(axis=0), rtol=1e-12)
    expect_x = ((train - train.mean(0)) / train.std(0)).astype(np.float32)
    np.testing.assert_allclose(fold.x_train.numpy(), expect_x, atol=1e-5)

    # Rewrite everything from the purge gap on (features and prices): training stats, inputs and
    # labels must not move; validation inputs must.
    v2 = values.copy()
    rng = np.random.default_rng(99)
    v2[fr.train_end :, 2:] = rng.standard_normal((len(v2) - fr.train_end, len(INPUTS))) * 7 + 3
    v2[fr.val_start :, :2] *= np.exp(rng.standard_normal((len(v2) - fr.val_start, 1)) * 0.01)
    store2, _ = load_store(ts, v2, 3)
    fold2 = fold_transition(store2.concat_view(keys), fr, MLP_CFG)
    assert torch.equal(fold.mean, fold2.mean) and torch.equal(fold.std, fold2.std)
    assert torch.equal(fold.x_train, fold2.x_train)
    assert torch.equal(fold.y_train, fold2.y_train) and torch.equal(fold.r1_train, fold2.r1_train)
    assert not torch.equal(fold.x_val, fold2.x_val)


def test_labels_on_device_equal_numpy() -> None:
    ts, values = make_market(3, 0.35, 2)
    store, keys = load_store(ts, values, 3)
    fr = make_range(ts, 3, 2)
    for target in ("blended", "h1"):
        cfg = MLP_CFG.model_copy(update={"target": target})
        fold = fold_transition(store.concat_view(keys), fr, cfg)
        close = values[fr.train_start : fr.val_end, 1]
        r1 = labels.forward_log_return(close, 1)
        y = labels.blended_target(close, (1, 5, 30))[0] if target == "blended" else r1
        n_tr = fr.train_end - fr.train_start
        v0 = fr.val_start - fr.train_start
        np.testing.assert_allclose(fold.r1_train.numpy(), r1[:n_tr], rtol=0, atol=1e-14)
        np.testing.assert_allclose(fold.y_train.numpy(), y[:n_tr], rtol=0, atol=1e-14)
        np.testing.assert_allclose(fold.y_val.numpy(), y[v0:], rtol=0, atol=1e-14, equal_nan=True)
        np.testing.assert_allclose(fold.r1_val.numpy(), r1[v0:], rtol=0, atol=1e-14, equal_nan=True)
        # validation labels never read past val_end: the tail is undefined, not borrowed
        assert np.isnan(fold.r1_val.numpy()[-2:]).all() and np.isfinite(fold.r1_val.numpy()[:-2]).all()
        assert np.isnan(fold.y_val.numpy()[-31:]).all() if target == "blended" else True
        assert np.isfinite(fold.y_train.numpy()).all()


def test_purge_is_asserted_and_price_inputs_refused() -> None:
    ts, values = make_market(3, 0.35, 3)
    store, keys = load_store(ts, values, 3)
    fr = make_range(ts, 3, 2)
    view = store.concat_view(keys)
    short = dataclasses.replace(fr, train_end=fr.val_start - labels.max_horizon() + 1)
    with pytest.raises(FxDataError, match="label reach"):
        fold_transition(view, short, MLP_CFG)
    with pytest.raises(FxDataError, match="raw price"):
        fold_transition(view, fr, MLP_CFG.model_copy(update={"input_columns": ("sig", "close")}))
    bad = values.copy()
    bad[fr.train_start + 17, 4] = np.nan
    store_bad, _ = load_store(ts, bad, 3)
    with pytest.raises(FxDataError, match=r"'n1'.*row " + str(fr.train_start + 17)):
        fold_transition(store_bad.concat_view(keys), fr, MLP_CFG)


def test_labels_across_a_contract_roll_are_undefined_and_left_out(tmp_path: Path) -> None:
    ts, values = make_market(3, 0.35, 4)
    store, keys = load_store(ts, values, 3)
    fr = make_range(ts, 3, 2)
    rolls = (2500, fr.val_start + 1000)
    seg = np.zeros(len(ts), np.int64)
    seg[rolls[0] :] = 1
    seg[rolls[1] :] = 2
    fold = fold_transition(store.concat_view(keys), fr, MLP_CFG, segments=seg)
    close = values[fr.train_start : fr.val_end, 1]
    j = np.arange(close.size) + fr.train_start
    r1 = labels.forward_log_return(close, 1)
    y = labels.blended_target(close, (1, 5, 30))[0]
    for roll in rolls:  # window [j+1, j+1+h] holds the roll iff j+1 < roll <= j+1+h
        r1[(j + 1 < roll) & (roll <= j + 2)] = np.nan
        y[(j + 1 < roll) & (roll <= j + 31)] = np.nan
    n_tr, v0 = fr.train_end - fr.train_start, fr.val_start - fr.train_start
    got = np.concatenate([fold.r1_train.numpy(), fold.r1_val.numpy()])
    np.testing.assert_allclose(got, np.concatenate([r1[:n_tr], r1[v0:]]), atol=1e-14, equal_nan=True)
    np.testing.assert_allclose(fold.y_train.numpy(), y[:n_tr], atol=1e-14, equal_nan=True)
    assert fold.extra["train_labels_undefined"] == 30  # the blended window is 31 prices wide
    res = train_mlp(fold, MLP_CFG.model_copy(update={"epochs": 1}), tmp_path / "m", ["k"])
    assert res.val_positions[rolls[1] - 2 - fr.val_start] == 0  # no position across the roll
    dq = train_dqn(
        fold, DQN_CFG.model_copy(update={"epochs": 1, "max_steps_per_epoch": 20}), tmp_path / "d", ["k"]
    )
    assert math.isfinite(dq.metrics["total_return"]) and dq.val_positions[rolls[1] - 2 - fr.val_start] == 0


def test_session_ids_of_validation_rows(signal_fold: FoldData) -> None:
    np.testing.assert_array_equal(signal_fold.val_sessions, calendar.session_day(signal_fold.val_ts))
    assert signal_fold.val_sessions.min() >= 0


# ------------------------------------------------------------------------------- MLP
def test_mlp_finds_planted_signal(signal_fold: FoldData, tmp_path: Path) -> None:
    res = train_mlp(signal_fold, MLP_CFG, tmp_path, ["k1"])
    m = res.metrics
    n = signal_fold.x_val.shape[0]
    assert m["auc_null_z"] > LEAK_Z and m["auc_h1_null_z"] > LEAK_Z and m["auc_null_p"] < 0.01, m
    assert m["sharpe"] > 1.0 and m["total_return"] > 0 and m["t_stat"] > 3, m
    assert m["gross_sharpe"] > m["net_sharpe"] == m["sharpe"] and m["cost_paid"] > 0, m  # net after costs
    assert 0 <= m["max_drawdown"] < 1 and 0 < m["turnover"] <= 2 and m["hit_rate"] > 0.5
    assert res.equity.shape == (n + 1,) and res.val_positions.shape == (n,)
    np.testing.assert_allclose(res.equity[-1], math.exp(m["total_log_return"]))


LEAK_Z = 3.0  # |AUC - 0.5| in sds of its block-permutation null (metrics.auc_block_null)


def detector_flags(m: dict[str, float]) -> list[str]:
    """The leak detector: validation AUCs (target and 1-bar return) beyond LEAK_Z sds of their
    empirical null, or a profit with a daily t above 3."""
    flags = [k for k in ("auc_null_z", "auc_h1_null_z") if abs(m[k]) >= LEAK_Z]
    n_days = m["n_sessions"]
    if math.isfinite(m["sharpe"]) and m["sharpe"] / math.sqrt(252) * math.sqrt(n_days) >= 3.0:
        flags.append("sharpe")
    return flags


def test_mlp_null_market_has_no_skill_and_stays_flat(null_fold: FoldData, tmp_path: Path) -> None:
    res = train_mlp(null_fold, MLP_CFG, tmp_path, ["k1"])
    m = res.metrics
    assert detector_flags(m) == [], m
    # no edge survives the cost on the inner block: the band keeps the model out of the market
    assert m["band_enter"] == 0.5 and m["turnover"] == 0 and m["net_total_log_return"] == 0, m


def test_mlp_band_follows_the_cost(signal_fold: FoldData, tmp_path: Path) -> None:
    """The band is chosen on the inner block after costs: a cost above the edge keeps the model
    flat where the cost-blind rule trades every bar's sign (and loses)."""
    dear = MLP_CFG.model_copy(update={"cost": 2e-3})
    blind = train_mlp(signal_fold, dear.model_copy(update={"trade_band": "fixed"}), tmp_path / "b", ["k"])
    band = train_mlp(signal_fold, dear, tmp_path / "a", ["k"])
    assert blind.metrics["coverage"] > 0.9 and blind.metrics["net_total_log_return"] < 0, blind.metrics
    assert band.metrics["turnover"] == 0 and band.metrics["net_total_log_return"] == 0, band.metrics
    assert band.metrics["gross_sharpe"] == band.metrics["net_sharpe"] == 0.0  # flat: no return, no risk
    assert blind.metrics["gross_total_log_return"] - blind.metrics["net_total_log_return"] == pytest.approx(
        blind.metrics["cost_paid"]
    )
    # without an inner hold-out the band comes from the (in-sample) training tail, never validation
    v = train_mlp(
        signal_fold,
        dear.model_copy(update={"early_stopping": "validation", "epochs": 1}),
        tmp_path / "v",
        ["k"],
    )
    assert v.metrics["band_candidates"] > 0 and math.isfinite(v.metrics["band_inner_t"])


def _leaky_null_fold(cfg: TrainConfig, seed: int, rho: float = 0.3) -> FoldData:
    """A null market whose input n0 is replaced by a one-bar look-ahead: at row j the return the
    position earns next, ln C[j+2] - ln C[j+1] (entry lag 1), mixed with noise (corr ``rho``)."""
    ts, values = make_market(3, 0.0, seed)
    logc = np.log(values[:, 1])
    fwd = np.zeros(len(ts))
    fwd[:-2] = logc[2:] - logc[1:-1]
    noise = np.random.default_rng(seed + 100).standard_normal(len(ts))
    col = COLUMNS.index("n0")
    values[:, col] = rho * fwd / fwd.std() + math.sqrt(1 - rho**2) * noise
    store, keys = load_store(ts, values, 3)
    return fold_transition(store.concat_view(keys), make_range(ts, 3, 2), cfg)


def test_planted_lookahead_fails_the_detector(null_fold: FoldData, tmp_path: Path) -> None:
    """Mutation test: the detector that passes the null market must fail it once one input looks
    one bar ahead, for both trainers."""
    mlp = train_mlp(_leaky_null_fold(MLP_CFG, 12), MLP_CFG, tmp_path / "m", ["k"]).metrics
    assert "auc_h1_null_z" in detector_flags(mlp), mlp
    dqn = train_dqn(_leaky_null_fold(DQN_CFG, 12), DQN_CFG, tmp_path / "d", ["k"]).metrics
    assert detector_flags(dqn), dqn


def test_mlp_shuffled_training_labels_kill_skill(signal_fold: FoldData, tmp_path: Path) -> None:
    """Shuffled training labels: what is left is chance. Not only sampling noise: the fitted
    function is a random direction in feature space whose loading on the (truly predictive)
    signal column is random, so the band is wider than 4 SE; over seeds 0-11 the shuffled
    auc_h1 stayed within 0.5 ± 0.055 while the real edge was 0.64-0.67."""
    real = train_mlp(signal_fold, MLP_CFG, tmp_path / "real", ["k1"]).metrics
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(signal_fold.y_train.shape[0], generator=g)
    shuffled = dataclasses.replace(
        signal_fold, y_train=signal_fold.y_train[perm], r1_train=signal_fold.r1_train[perm]
    )
    res = train_mlp(shuffled, MLP_CFG, tmp_path / "shuffled", ["k1"]).metrics
    assert real["auc_h1"] > 0.6, real
    assert abs(res["auc_h1"] - 0.5) < 0.08 and res["auc_h1"] - 0.5 < 0.5 * (real["auc_h1"] - 0.5), res
    assert res["t_stat"] < 3.0 and res["total_return"] < 0.5 * real["total_return"], res


def test_mlp_deterministic_and_checkpoints(signal_fold: FoldData, tmp_path: Path) -> None:
    cfg = MLP_CFG.model_copy(update={"epochs": 2})
    a = train_mlp(signal_fold, cfg, tmp_path / "a", ["fxcache/q1", "fxcache/q2"])
    b = train_mlp(signal_fold, cfg, tmp_path / "b", ["fxcache/q1", "fxcache/q2"])
    c = train_mlp(signal_fold, cfg.model_copy(update={"seed": 4}), tmp_path / "c", ["x"])
    timing = {"epoch_seconds", "train_seconds"}
    same = {k: v for k, v in a.metrics.items() if k not in timing}
    assert same == {k: v for k, v in b.metrics.items() if k not in timing}
    assert same != {k: v for k, v in c.metrics.items() if k not in timing}
    wa, wb, wc = (load_state(r.best_path) for r in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    np.testing.assert_array_equal(a.val_positions, b.val_positions)

    side = json.loads(a.sidecar_path.read_text())
    assert side["config"] == json.loads(cfg.model_dump_json())
    assert TrainConfig.model_validate(side["config"]) == cfg
    assert side["input_keys"] == ["fxcache/q1", "fxcache/q2"]
    assert side["metrics"]["auc"] == a.metrics["auc"]
    assert side["norm"]["mean"] == signal_fold.mean.tolist() and side["norm"]["columns"] == list(
        signal_fold.columns
    )
    model = build_mlp(side["architecture"])
    model.load_state_dict(load_state(a.best_path))
    p = predict_proba(model, signal_fold.x_val).double().numpy()
    np.testing.assert_array_equal(
        np.where(
            np.isfinite(signal_fold.r1_val.numpy()),
            band_positions(p, a.metrics["band_enter"], a.metrics["band_exit"]),
            0,
        ),
        a.val_positions,
    )
    assert a.last_path.exists() and build_mlp(side["architecture"]).load_state_dict(load_state(a.last_path))


# ------------------------------------------------------------------------------- DQN
def test_resolve_positions_scan() -> None:
    table = np.array([[2, 2, 2], [0, 1, 1], [1, 0, 2], [2, 2, 0]], dtype=np.int8)
    allowed = np.array([True, True, True, False])
    # start flat -> a=table[0,1]=2 (long) -> table[1,2]=1 (flat) -> table[2,1]=0 (short) -> forced flat
    np.testing.assert_array_equal(resolve_positions(table, allowed), [1, 0, -1, 0])


def test_dqn_beats_flat_on_signal_and_is_deterministic(tmp_path: Path) -> None:
    fold = build_fold(0.35, 21, DQN_CFG)[0]
    a = train_dqn(fold, DQN_CFG, tmp_path / "a", ["k"])
    assert a.metrics["total_return"] > 0 and a.metrics["sharpe"] > 1.0 and a.metrics["t_stat"] > 3, a.metrics
    b = train_dqn(fold, DQN_CFG, tmp_path / "b", ["k"])
    assert a.metrics["total_return"] == b.metrics["total_return"]
    wa, wb = load_state(a.best_path), load_state(b.best_path)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the checkpoint reproduces the greedy validation path
    side = json.loads(a.sidecar_path.read_text())
    net = build_qnet(side["architecture"])
    net.load_state_dict(wa)
    table, _ = greedy_table(net, fold.x_val)
    pos = resolve_positions(table.numpy(), np.isfinite(fold.r1_val.numpy()))
    np.testing.assert_array_equal(pos, a.val_positions)
    assert side["input_keys"] == ["k"] and side["metrics"]["sharpe"] == a.metrics["sharpe"]


def test_dqn_null_and_shuffled_have_no_skill(tmp_path: Path) -> None:
    null = build_fold(0.0, 22, DQN_CFG)[0]
    r = train_dqn(null, DQN_CFG, tmp_path / "n", ["k"])
    assert detector_flags(r.metrics) == [] and r.metrics["t_stat"] < 3.0, r.metrics
    sig = build_fold(0.35, 23, DQN_CFG)[0]
    perm = torch.randperm(sig.r1_train.shape[0], generator=torch.Generator().manual_seed(1))
    shuffled = dataclasses.replace(sig, y_train=sig.y_train[perm], r1_train=sig.r1_train[perm])
    s = train_dqn(shuffled, DQN_CFG, tmp_path / "s", ["k"])
    assert s.metrics["t_stat"] < 3.0, s.metrics
    c = train_dqn(sig, DQN_CFG.model_copy(update={"seed": 6}), tmp_path / "c", ["k"])
    wa, wc = load_state(c.best_path), load_state(s.best_path)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_trainers_find_signal_deterministically(tmp_path: Path) -> None:
    ts, values = make_market(3, 0.35, 31)
    store, keys = load_store(ts, values, 3, device="cuda")
    fold = fold_transition(store.concat_view(keys), make_range(ts, 3, 2), MLP_CFG)
    assert fold.x_train.is_cuda and fold.y_val.is_cuda and store.stats()["uploads"] == 3
    a = train_mlp(fold, MLP_CFG, tmp_path / "a", ["k"])
    b = train_mlp(fold, MLP_CFG, tmp_path / "b", ["k"])
    assert a.metrics["auc_h1"] > 0.55 and a.metrics["t_stat"] > 3, a.metrics
    assert a.metrics["total_return"] == b.metrics["total_return"]
    c = train_dqn(fold, DQN_CFG, tmp_path / "c", ["k"])
    d = train_dqn(fold, DQN_CFG, tmp_path / "d", ["k"])
    assert c.metrics["t_stat"] > 3, c.metrics
    assert c.metrics["total_return"] == d.metrics["total_return"]
    wc, wd = load_state(c.best_path), load_state(d.best_path)
    assert all(torch.equal(wc[k], wd[k]) for k in wc)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_fold_kernels_equal_torch_ops() -> None:
    """The Triton fold kernels give the torch path's stats and inputs (and flag bad inputs)."""
    from fx_assets.core.trainers import transition

    ts, values = make_market(3, 0.35, 41)
    store, keys = load_store(ts, values, 3, device="cuda")
    view, fr = store.concat_view(keys), make_range(ts, 3, 2)
    fused = fold_transition(view, fr, MLP_CFG)
    assert fused.extra["fused_kernels"], transition._FUSED_STATE
    transition._FUSED_STATE["enabled"] = False
    try:
        ref = fold_transition(view, fr, MLP_CFG)
    finally:
        transition._FUSED_STATE["enabled"] = True
    assert not ref.extra["fused_kernels"]
    torch.testing.assert_close(fused.mean, ref.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.std, ref.std, rtol=1e-10, atol=0)
    torch.testing.assert_close(fused.x_train, ref.x_train, rtol=0, atol=1e-5)
    torch.testing.assert_close(fused.x_val, ref.x_val, rtol=0, atol=1e-5)
    # differences of the same per-upload ln close; within an ulp (torch divides by a scalar as a
    # multiply by its reciprocal on CUDA, the kernel divides)
    for a, b in ((fused.r1_train, ref.r1_train), (fused.y_train, ref.y_train), (fused.r1_val, ref.r1_val)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15, equal_nan=True)
    torch.testing.assert_close(fused.y_val, ref.y_val, rtol=0, atol=1e-15, equal_nan=True)
    assert int(torch.isnan(fused.y_val).sum()) == labels.max_horizon(MLP_CFG.horizons, MLP_CFG.entry_lag)
    bad = view.values.clone()
    bad[fr.val_start + 3, view.column_index(fused.columns[1])] = float("inf")
    view_bad = dataclasses.replace(view, values=bad)
    with pytest.raises(FxDataError, match=rf"{fused.columns[1]!r}.*row {fr.val_start + 3}"):
        fold_transition(view_bad, fr, MLP_CFG)
