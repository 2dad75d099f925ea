"""Snapshot-row labels: each form equals its definition row by row, reads exactly its window,
never spans a break, fits its dead band on training rows only, and handles zero moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fx_assets.core.errors import FxDataError
from fx_assets.core.snapshot_labels import (
    AbsChangeQuantile,
    SnapshotLabelConfig,
    back_rows,
    classify,
    fit_alpha,
    half_ticks,
    horizon_clock_ns,
    label_reach,
    relative_change,
    running_breaks,
    snapshot_labels,
)

TICK = 0.25
FORMS = ("unsmoothed", "fi", "deeplob", "tlob")


def _mids(n: int, seed: int = 0, p_move: float = 0.3) -> np.ndarray:
    """A half-tick mid path (ES-like: 5000, moves of one half-tick, many zero moves)."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([-1, 0, 1], size=n, p=[p_move / 2, 1 - p_move, p_move / 2])
    return (2 * 5000 / TICK + np.cumsum(steps)) * (TICK / 2)


def _reference(p: np.ndarray, brk: np.ndarray, h: int, form: str, smooth: int) -> np.ndarray:
    """The formulas of reference/snapshot.md §1, row by row in plain Python."""
    n = p.shape[0]
    out = np.full(n, np.nan)
    back = {"unsmoothed": 1, "fi": 1, "deeplob": h, "tlob": min(smooth, h)}[form]
    for i in range(n):
        lo, hi = i - back + 1, i + h
        if lo < 0 or hi >= n or brk[lo] != brk[hi]:
            continue
        if form == "unsmoothed":
            out[i] = (p[i + h] - p[i]) / p[i]
        elif form == "fi":
            out[i] = (np.mean(p[i + 1 : i + h + 1]) - p[i]) / p[i]
        elif form == "deeplob":
            past = np.mean(p[i - h + 1 : i + 1])
            out[i] = (np.mean(p[i + 1 : i + h + 1]) - past) / past
        else:
            w = back
            past = np.mean(p[i - w + 1 : i + 1])
            out[i] = (np.mean(p[i + h - w + 1 : i + h + 1]) - past) / past
    return out


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("h", [1, 3, 10, 25])
def test_each_form_equals_its_definition_and_never_spans_a_break(form: str, h: int) -> None:
    n = 600
    p = _mids(n, seed=h)
    session = np.repeat([0, 1, 2], [250, 200, 150])
    contract = np.where(np.arange(n) < 380, 202403, 202406)
    brk = running_breaks(session, contract)
    assert brk[-1] == 3 and brk[0] == 0
    got = relative_change(half_ticks(torch.from_numpy(p), TICK), torch.from_numpy(brk), h, form, 10)  # type: ignore[arg-type]
    want = _reference(p, brk, h, form, 10)
    np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15, equal_nan=True)
    # no label reads across a session boundary or the roll
    for b in (250, 380, 450):
        back = back_rows(form, h, 10)  # type: ignore[arg-type]
        rows = np.arange(max(0, b - h), min(n, b + back - 1))
        assert np.isnan(got.numpy()[rows]).all()


@pytest.mark.parametrize("form", FORMS)
def test_label_reads_exactly_its_window(form: str) -> None:
    """Changing the mid outside rows [n-back+1, n+h] leaves label n unchanged; inside, it moves."""
    n, h, i = 300, 20, 150
    p = _mids(n, seed=3)
    base = relative_change(half_ticks(torch.from_numpy(p), TICK), None, h, form, 10)  # type: ignore[arg-type]
    back = back_rows(form, h, 10)  # type: ignore[arg-type]
    for j in (i - back, i + h + 1, 0, n - 1):
        q = p.copy()
        q[j] += 40 * TICK
        moved = relative_change(half_ticks(torch.from_numpy(q), TICK), None, h, form, 10)  # type: ignore[arg-type]
        assert float(moved[i]) == float(base[i]), (form, j)
    q = p.copy()
    q[i + h] += 40 * TICK  # the last row of the window always counts
    moved = relative_change(half_ticks(torch.from_numpy(q), TICK), None, h, form, 10)  # type: ignore[arg-type]
    assert float(moved[i]) != float(base[i])


def test_reach_covers_every_window() -> None:
    assert label_reach(SnapshotLabelConfig(horizons=[10, 500])) == 501
    assert label_reach(SnapshotLabelConfig(horizons=[10, 50], form="deeplob")) == 100
    assert label_reach(SnapshotLabelConfig(horizons=[5, 50], form="tlob", smooth=10)) == 60


def test_dead_band_from_training_rows_only_and_zero_moves_explicit() -> None:
    n, n_train = 4000, 2500
    p = _mids(n, seed=7, p_move=0.2)  # many zero moves at short horizons
    cfg = SnapshotLabelConfig(horizons=[2, 50], stationary_share=0.4, zero="exclude")
    labs = snapshot_labels(torch.from_numpy(p), TICK, n_train, cfg)
    q = p.copy()
    q[n_train + 100 :] += np.cumsum(np.ones(n - n_train - 100)) * TICK  # a validation-only trend
    labs_q = snapshot_labels(torch.from_numpy(q), TICK, n_train, cfg)
    for a, b in zip(labs, labs_q, strict=True):
        assert a.alpha == b.alpha  # fitted on training rows only
    short, long = labs
    # at 2 rows most moves are zero: the 40% quantile of |change| is 0, the band cannot balance
    assert short.alpha == 0.0 and short.shares["stationary"] > 0.4
    assert long.alpha > 0.0 and abs(long.shares["stationary"] - 0.4) < 0.05
    for lab in labs:
        tr = lab.classes[:n_train]
        assert not bool((tr == 0).any())  # excluded, not labelled down or up
        excluded = float(torch.isnan(tr).sum()) / n_train - (1 - lab.shares["defined"])
        assert abs(excluded - lab.shares["excluded"] * lab.shares["defined"]) < 1e-9
        # every label's sign is the realised move's (beyond the band)
        ch = lab.change.numpy()
        cls = lab.classes.numpy()
        ok = ~np.isnan(cls)
        assert (np.sign(ch[ok]) == cls[ok]).all() and (np.abs(ch[ok]) > lab.alpha).all()
    three = snapshot_labels(
        torch.from_numpy(p), TICK, n_train, cfg.model_copy(update={"zero": "three_class"})
    )
    assert bool((three[0].classes[:n_train] == 0).any())
    assert "excluded" not in three[0].shares


def test_unsmoothed_sign_is_the_realised_mid_move() -> None:
    p = _mids(1000, seed=11)
    (lab,) = snapshot_labels(
        torch.from_numpy(p), TICK, 800, SnapshotLabelConfig(horizons=[10], zero="three_class")
    )
    up = p[10:] > p[:-10]
    down = p[10:] < p[:-10]
    cls = lab.classes.numpy()[:-10]
    assert ((cls == 1) == up).all() and ((cls == -1) == down).all()


def test_bad_mids_are_refused_by_row() -> None:
    p = _mids(50)
    with pytest.raises(FxDataError, match="float64"):
        half_ticks(torch.from_numpy(p.astype(np.float32)), TICK)
    q = p.copy()
    q[17] += 0.01
    with pytest.raises(FxDataError, match="row 17"):
        half_ticks(torch.from_numpy(q), TICK)
    with pytest.raises(ValueError, match="distinct positive"):
        SnapshotLabelConfig(horizons=[10, 10])
    with pytest.raises(ValueError):
        SnapshotLabelConfig(stationary_share=float("nan"))


def test_horizon_clock_time_skips_breaks() -> None:
    ts = np.cumsum(np.full(100, 1_000), dtype=np.int64)
    ts[60:] += 10**12  # a session gap
    brk = running_breaks(np.repeat([0, 1], [60, 40]))
    assert horizon_clock_ns(ts, brk, [5]) == {5: 5_000.0}
    assert horizon_clock_ns(ts, None, [5])[5] == 5_000.0  # the median ignores the few gap rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("zero", ["exclude", "three_class"])
def test_fused_kernel_equals_the_torch_definition_bitwise(form: str, zero: str) -> None:
    """The fold transition's one-kernel labels (trainers.snapshot_label_kernel) on CUDA equal the
    torch definition on the CPU bit for bit: changes, classes, the 1-row reward and the shares,
    with breaks and without, across many kernel programs."""
    from fx_assets.core.snapshot_labels import labels_of_ticks
    from fx_assets.core.trainers.snapshot_label_kernel import fused_snapshot_labels

    n, n_tr = 300_001, 200_000
    u = half_ticks(torch.from_numpy(_mids(n, seed=3)), TICK)
    brk = torch.from_numpy(running_breaks(np.random.default_rng(4).integers(0, 400, n) == 0))
    cfg = SnapshotLabelConfig(horizons=[1, 10, 20, 50, 100, 500], form=form, zero=zero, smooth=7)
    for b in (brk, None):
        got = fused_snapshot_labels(u.cuda(), None if b is None else b.cuda(), n_tr, cfg)
        assert got is not None, "the fused kernel did not run"
        labs, r1 = got
        want = labels_of_ticks(u, n_tr, cfg, b)
        for g, w in zip(labs, want, strict=True):
            assert g.horizon == w.horizon and g.train_defined == w.train_defined and g.shares == w.shares
            for a, e in ((g.change, w.change), (g.classes, w.classes)):
                a = a.cpu()
                assert torch.equal(torch.isnan(a), torch.isnan(e))
                assert torch.equal(a.nan_to_num(7.0).view(torch.int64), e.nan_to_num(7.0).view(torch.int64))
        e1 = relative_change(u, b, 1, "unsmoothed", 1)
        assert torch.equal(r1.cpu().nan_to_num(7.0).view(torch.int64), e1.nan_to_num(7.0).view(torch.int64))
    # a fitted dead band is the torch path's
    assert (
        fused_snapshot_labels(u.cuda(), brk.cuda(), n_tr, cfg.model_copy(update={"stationary_share": 0.3}))
        is None
    )


def test_streamed_dead_band_is_fit_alpha_bit_for_bit() -> None:
    """The dead band fitted block by block (distinct values with counts, merged at any point)
    is torch.quantile's over all the values at once, bit for bit: with ties (zero moves), NaN
    rows, blocks of any size and shares whose rank falls on either side of the half."""
    rng = np.random.default_rng(3)
    for t in range(300):
        n = int(rng.integers(1, 2000))
        x = [
            rng.standard_normal(n) * 1e-4,
            rng.integers(-3, 4, n) / rng.integers(19_000, 21_000, n),  # half-tick ratios: many ties
            np.where(rng.random(n) < 0.7, 0.0, rng.standard_normal(n)),
        ][t % 3]
        x[rng.random(n) < 0.05] = np.nan
        if not np.isfinite(x).any():
            continue
        share = float(rng.choice([0.1, 0.3, 0.5, 0.7, 0.9])) if t % 2 else float(rng.uniform(0.01, 0.99))
        fit = AbsChangeQuantile(share)
        fit.COMPACT_AT = int(rng.integers(1, 50))  # merge often
        for block in np.split(x, np.sort(rng.integers(0, n, int(rng.integers(0, 6))))):
            fit.add(torch.from_numpy(block))
        assert fit.n == int(np.isfinite(x).sum())
        assert fit.alpha() == fit_alpha(torch.from_numpy(x), share), (t, n, share)
    with pytest.raises(FxDataError, match="no defined training label"):
        AbsChangeQuantile(0.5).alpha()


def test_classify_is_the_classes_of_snapshot_labels() -> None:
    p = _mids(3000, seed=4)
    for zero in ("exclude", "three_class"):
        cfg = SnapshotLabelConfig(horizons=[10, 50], stationary_share=0.4, zero=zero)  # type: ignore[arg-type]
        for hl in snapshot_labels(torch.from_numpy(p), TICK, 2000, cfg):
            got = classify(hl.change, hl.alpha, cfg.zero)
            assert torch.equal(got.nan_to_num(7.0), hl.classes.nan_to_num(7.0))


def test_dead_band_of_more_values_than_torch_quantile_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resident fold with more defined training labels than torch.quantile accepts (2**24)
    still gets its dead band, the same number: the exact streaming quantile takes over."""
    import fx_assets.core.snapshot_labels as sl

    rng = np.random.default_rng(9)
    x = torch.from_numpy(np.where(rng.random(5001) < 0.4, 0.0, rng.standard_normal(5001) * 1e-4))
    x[::97] = float("nan")
    want = {s: fit_alpha(x, s) for s in (0.1, 0.37, 0.5, 0.9)}
    monkeypatch.setattr(sl, "QUANTILE_MAX", 1000)  # the large-input path, on a small input
    for s, w in want.items():
        assert fit_alpha(x, s) == w
    monkeypatch.undo()
    big = torch.zeros(sl.QUANTILE_MAX + 1, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="too large"):
        torch.quantile(big, 0.5)  # what fit_alpha used to call on every fold
    assert fit_alpha(big, 0.25) == 0.0
