"""Supervised baseline: an MLP on the fold's normalised inputs predicting the sign of the target.

Owns the MLP trainer and its trading rule. Loss: BCE on ``1{y > 0}`` over training rows with
``y != 0`` (zero returns carry no sign). Snapshot rows with ``snapshot_zero='three_class'``
(:attr:`TrainConfig.three_class`): a 3-way softmax over (up, stationary, down) fitted by
cross-entropy on every training row with a defined class (+1 / 0 / -1, the stationary rows
included); its score is ``p = (1 + P(up) − P(down)) / 2`` (in [0, 1], 0.5 when up and down are
equally likely), so everything below (band, AUC against the sign of the move, null, the report's
``val_predictions.npz`` ``score``) reads it as it reads the binary P(up), and the three
probabilities are handed back beside it (``TrainResult.val_proba``). The trading rule turns the score ``s = p − 0.5`` into
positions with a no-trade band (hysteresis): enter long above ``+enter``, short below
``−enter``, go flat when the score falls back through ``±exit`` (``exit ≤ enter``). With
``trade_band='inner'`` the band is chosen *after costs* on the inner purged block of the
training rows (the block early stopping uses, never validation): the candidate with the largest
inner net return among those whose inner net daily t-statistic reaches ``band_min_t``, else no
trade at all (``enter = 0.5``: |s| < 0.5 always). A model without edge therefore stays flat.
Validation, on the validation quarter only: AUC of ``p`` against the sign of the target with
its block-permutation null (the leak detector), and the trading evaluation earning
``pos · y^(1) − cost · |Δpos|`` per bar, gross and net: daily Sharpe over the session ids, max
drawdown, hit rate, turnover. Early stopping keeps the best epoch by ``cfg.metric_name()``;
best and last weights go to safetensors with a JSON sidecar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from numba import njit

from fx_assets.core import metrics as M
from fx_assets.core.errors import FxDataError
from fx_assets.core.trainers.common import (
    EarlyStopping,
    FoldData,
    GraphRunner,
    TrainConfig,
    TrainResult,
    evaluate_positions,
    finish_training,
    leak_detector,
    make_generator,
    make_optimizer,
    mlp_layers,
    seeded,
    selection_split,
    sidecar_base,
    state_to_cpu,
    use_cuda_graph,
)
from fx_assets.core.trainers.rows import FoldRows, Part, as_rows, block_order

_EVAL_CHUNK = 1 << 16


#: the outputs of a three-class MLP, in order (class index = 1 - label)
THREE_CLASSES = ("up", "stationary", "down")


def build_mlp(arch: dict[str, Any]) -> torch.nn.Sequential:
    """Rebuild the network described by a sidecar's ``architecture`` entry."""
    if arch.get("kind") != "mlp":
        raise FxDataError(f"architecture {arch.get('kind')!r} is not an MLP")
    out_dim = int(arch.get("out_dim", 1))  # 3: the (up, stationary, down) softmax
    return mlp_layers(int(arch["in_dim"]), tuple(arch["hidden"]), out_dim, float(arch["dropout"]))


def three_class_score(proba: torch.Tensor) -> torch.Tensor:
    """The score of a three-class model from its probabilities ``[n, 3]`` (up, stationary,
    down): ``(1 + P(up) − P(down)) / 2``, monotone in ``P(up) − P(down)`` and 0.5 where up and
    down are equally likely, so it reads like the binary P(up)."""
    return 0.5 * (1.0 + proba[:, 0] - proba[:, 2])


@torch.no_grad()
def predict_classes(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A three-class model's probabilities ``[n, 3]`` (up, stationary, down) for each row of
    normalised inputs ``x`` (chunked, eval mode)."""
    was = model.training
    model.eval()
    out = torch.cat(
        [torch.softmax(model(x[i : i + _EVAL_CHUNK]), dim=1) for i in range(0, x.shape[0], _EVAL_CHUNK)]
    )
    model.train(was)
    if out.shape[1] != 3:
        raise FxDataError(f"predict_classes: the model has {out.shape[1]} outputs, not 3")
    return out


@torch.no_grad()
def predict_proba(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The score of each row of normalised inputs ``x`` (chunked, eval mode): P(y > 0) of a
    binary model, :func:`three_class_score` of a three-class one."""
    if _out_dim(model) == 3:
        return three_class_score(predict_classes(model, x).double())
    was = model.training
    model.eval()
    out = torch.cat(
        [torch.sigmoid(model(x[i : i + _EVAL_CHUNK]).squeeze(1)) for i in range(0, x.shape[0], _EVAL_CHUNK)]
    )
    model.train(was)
    return out


def _out_dim(model: torch.nn.Module) -> int:
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    return int(last.out_features)


def positions_from_proba(p: npt.NDArray[np.float64], threshold: float) -> npt.NDArray[np.int8]:
    """Flat inside ``0.5 ± threshold``, else the sign of ``p − 0.5`` (no hysteresis)."""
    pos = np.zeros(p.shape[0], dtype=np.int8)
    pos[p > 0.5 + threshold] = 1
    pos[p < 0.5 - threshold] = -1
    return pos


@njit(cache=True)
def _band_positions_nb(s: np.ndarray, allowed: np.ndarray, enter: float, exit_: float) -> np.ndarray:
    n = s.shape[0]
    out = np.zeros(n, dtype=np.int8)
    p = 0
    for t in range(n):
        x = s[t]
        if not allowed[t]:
            p = 0
        elif x > enter:
            p = 1
        elif x < -enter:
            p = -1
        elif (p == 1 and x <= exit_) or (p == -1 and x >= -exit_):
            p = 0
        out[t] = p
    return out


def band_positions(
    p: npt.NDArray[np.float64], enter: float, exit_: float, allowed: npt.NDArray[np.bool_] | None = None
) -> npt.NDArray[np.int8]:
    """Positions from probabilities with the no-trade band ``(enter, exit_)`` on ``s = p − 0.5``."""
    if not 0 <= exit_ <= enter:
        raise FxDataError(f"band: need 0 <= exit {exit_} <= enter {enter}")
    ok = np.ones(p.shape[0], dtype=np.bool_) if allowed is None else np.ascontiguousarray(allowed)
    return _band_positions_nb(np.ascontiguousarray(p - 0.5, dtype=np.float64), ok, float(enter), float(exit_))


BAND_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.98, 0.99)  # entry levels: quantiles of |p − 0.5| (inner)
BAND_EXITS = (1.0, 0.5, 0.0)  # exit level as a fraction of the entry level
NO_TRADE = 0.5  # an entry level no score reaches: |p − 0.5| < 0.5


def choose_band(
    p: npt.NDArray[np.float64], block: dict[str, np.ndarray], cfg: TrainConfig
) -> dict[str, float]:
    """The no-trade band for ``cfg``, from the inner block's probabilities ``p`` (module docstring).

    ``band_enter``/``band_exit``: the chosen levels on ``|p − 0.5|`` (``band_enter = 0.5``: never
    trade); ``band_inner_net``/``band_inner_t``: the chosen candidate's inner net return and net
    daily t-statistic (0 when flat); ``band_candidates``: how many were tried.
    """
    if cfg.trade_band == "fixed":
        thr = cfg.eval_threshold
        return {
            "band_enter": thr,
            "band_exit": thr,
            "band_inner_net": math.nan,
            "band_inner_t": math.nan,
            "band_candidates": 0.0,
        }
    r1 = block["r1"]
    ok = np.isfinite(r1)
    y = np.where(ok, r1, 0.0)
    a = np.abs(p - 0.5)
    best = {"band_enter": NO_TRADE, "band_exit": NO_TRADE, "band_inner_net": 0.0, "band_inner_t": 0.0}
    n_cand = 0
    for q in BAND_QUANTILES:
        enter = float(np.quantile(a, q)) if a.size else NO_TRADE
        for f in BAND_EXITS:
            n_cand += 1
            pos = band_positions(p, enter, f * enter, ok)
            ret = M.strategy_returns(pos, y, cfg.cost)
            _, rd = M.daily_returns(ret, block["sessions"])
            sd = float(rd.std(ddof=1)) if rd.size > 1 else 0.0
            t = float(rd.mean() / sd * math.sqrt(rd.size)) if sd > 0 else 0.0
            total = float(ret.sum())
            if t >= cfg.band_min_t and total > best["band_inner_net"]:
                best = {
                    "band_enter": enter,
                    "band_exit": f * enter,
                    "band_inner_net": total,
                    "band_inner_t": t,
                }
    return {**best, "band_candidates": float(n_cand)}


def block_metrics(
    p: npt.NDArray[np.float64], block: dict[str, np.ndarray], cfg: TrainConfig, band: dict[str, float]
) -> tuple[dict[str, float], npt.NDArray[np.int8], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """AUC and trading metrics (gross and net) of probabilities ``p`` on one block, trading with ``band``."""
    pos = band_positions(p, band["band_enter"], band["band_exit"])
    m, pos, ret, eq = evaluate_positions(pos, block["r1"], block["sessions"], cfg.cost)
    m["auc"] = M.auc_returns(p, block["y"])  # against the training target's sign
    m["auc_h1"] = M.auc_returns(p, block["r1"])  # against the 1-bar return's sign
    m.update(band)
    return m, pos, ret, eq


def _predict_blocks(model: torch.nn.Module, rows: FoldRows, part: Part, lo: int, hi: int) -> np.ndarray:
    """P(y > 0) of rows ``[lo, hi)`` of ``part``, block by block, on the host (float64)."""
    out = [predict_proba(model, b.x).double().cpu().numpy() for b in rows.block_list(part, lo, hi)]  # type: ignore[arg-type]
    return np.concatenate(out) if out else np.empty(0)


def _predict_class_blocks(model: torch.nn.Module, rows: FoldRows, part: Part, lo: int, hi: int) -> np.ndarray:
    """A three-class model's probabilities ``[n, 3]`` of rows ``[lo, hi)`` of ``part`` (host, f64)."""
    out = [predict_classes(model, b.x).double().cpu().numpy() for b in rows.block_list(part, lo, hi)]  # type: ignore[arg-type]
    return np.concatenate(out) if out else np.empty((0, 3))


def train_mlp(
    fold: FoldData | FoldRows, cfg: TrainConfig, out_dir: Path | str, input_keys: Sequence[str]
) -> TrainResult:
    """Train the MLP baseline on one fold; write best/last checkpoints under ``out_dir``.

    The fold's fitted rows come as blocks (:mod:`~fx_assets.core.trainers.rows`): each epoch
    visits them in a seeded order and, in each block, its rows with a finite non-zero target in
    a random order (the batch generator's permutation). A resident fold with ``block_rows=None``
    is one block, used in place. With ``cfg.three_class`` the rows with a defined class (+1 / 0
    / -1) are fitted by a 3-way softmax (module docstring).
    """
    rows = as_rows(fold, cfg.block_rows)
    dev = rows.device
    metric = cfg.metric_name()
    graphed = use_cuda_graph(dev)
    f = rows.n_features
    three = cfg.three_class
    n_out = 3 if three else 1
    with seeded(cfg.seed, cfg.deterministic):
        model = mlp_layers(f, cfg.hidden, n_out, cfg.dropout).to(dev)
        opt = make_optimizer(model, cfg, capturable=graphed)
        gen = make_generator(dev, cfg.seed + 1_000_003)
        fit_end, inner_start = selection_split(rows, cfg)
        n_tr = rows.n_train
        spans = rows.grid("train", 0, fit_end)
        host = rows.host_labels("val", 0, rows.n_val)
        inner = rows.host_labels("train", inner_start, n_tr)
        band_start = n_tr - max(1, int(n_tr * cfg.inner_frac))
        band_tail = rows.host_labels("train", band_start, n_tr)
        # binary: BCE on 1{y > 0}; three classes: cross-entropy on the class index 1 - y
        # (up 0, stationary 1, down 2)
        lossf: torch.nn.Module = torch.nn.CrossEntropyLoss() if three else torch.nn.BCEWithLogitsLoss()
        z_dtype = torch.long if three else torch.float32

        def targets(y: torch.Tensor) -> torch.Tensor:
            if three:  # undefined rows are never drawn; 1 keeps the cast defined
                return torch.where(torch.isfinite(y), 1.0 - y, 1.0).to(torch.long)
            return (y > 0).to(torch.float32)

        # The step over full batches is a fixed op sequence on persistent tensors (the batch is
        # row ``s`` of the block's permutation, ``s`` a device counter), so on CUDA it is
        # captured once as a CUDA graph and replayed; a block's last partial batch runs eagerly.
        # A single stable block is used in place; otherwise each block is copied into one
        # work buffer (the graph reads fixed addresses).
        bs = cfg.batch_size
        cap = max(b - a for a, b in spans)
        in_place = rows.stable and len(spans) == 1
        work = {
            "x": None if in_place else torch.empty((cap, f), dtype=torch.float32, device=dev),
            "z": None if in_place else torch.empty(cap, dtype=z_dtype, device=dev),
        }
        cap_full = cap // bs
        perm_buf = torch.empty(cap, dtype=torch.long, device=dev)
        batch_no = torch.zeros(1, dtype=torch.long, device=dev)
        loss_sum = torch.zeros((), device=dev)
        params = list(model.parameters())

        def learn(b: torch.Tensor) -> None:
            out = model(work["x"][b])  # type: ignore[index]
            loss = lossf(out if three else out.squeeze(1), work["z"][b])  # type: ignore[index]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            loss_sum.add_(loss.detach())

        def full_step() -> None:
            learn(perm_buf[: cap_full * bs].view(cap_full, bs).index_select(0, batch_no).view(bs))
            batch_no.add_(1)

        runner = GraphRunner(full_step, dev, graphed)
        stopper = EarlyStopping(metric, cfg.patience, model)
        history: list[dict[str, float]] = []
        n_labelled = 0
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            model.train()
            loss_sum.zero_()
            steps_done, n_labelled = 0, 0
            budget = cfg.max_steps_per_epoch
            for blk in rows.blocks("train", spans, block_order(len(spans), cfg.seed, epoch)):
                if budget is not None and steps_done >= budget:
                    break
                y = blk.y
                fit = torch.isfinite(y) if three else torch.isfinite(y) & (y != 0)
                idx = torch.nonzero(fit).squeeze(1)
                n = int(idx.numel())
                n_labelled += n
                if n == 0:
                    continue
                if in_place:
                    if work["x"] is None:
                        work["x"], work["z"] = blk.x, targets(y)
                else:
                    work["x"][: blk.n].copy_(blk.x)  # type: ignore[index,arg-type]
                    work["z"][: blk.n].copy_(targets(y))  # type: ignore[index]
                perm_buf[:n].copy_(idx[torch.randperm(n, generator=gen, device=dev)])
                batch_no.zero_()
                steps = math.ceil(n / bs)
                if budget is not None:
                    steps = min(steps, budget - steps_done)
                full = n // bs
                runner.run(min(steps, full))
                if steps > full:  # the block's last, partial batch
                    learn(perm_buf[full * bs : n])
                steps_done += steps
            if epoch == 0 and n_labelled == 0:
                what = "a defined label class" if three else "a non-zero label"
                raise FxDataError(f"fold {rows.keys}: no training rows with {what}")
            train_loss = float(loss_sum) / max(1, steps_done)  # the epoch's one sync
            t_train = time.perf_counter() - t0
            if three:  # the score from the probabilities, which are kept beside it
                proba = _predict_class_blocks(model, rows, "val", 0, rows.n_val)
                p = three_class_score(torch.from_numpy(proba)).numpy()
            else:
                p = _predict_blocks(model, rows, "val", 0, rows.n_val)
            if cfg.early_stopping == "inner":
                pin = _predict_blocks(model, rows, "train", inner_start, n_tr)
                band = choose_band(pin, inner, cfg)  # after costs, on the inner block only
                sel = block_metrics(pin, inner, cfg, band)[0][metric]
                m, pos, ret, eq = block_metrics(p, host, cfg, band)
            else:  # no held-out block: the band comes from the training tail, in sample
                pin = _predict_blocks(model, rows, "train", band_start, n_tr)
                m, pos, ret, eq = block_metrics(p, host, cfg, choose_band(pin, band_tail, cfg))
                sel = m[metric]
            m.update(
                epoch=float(epoch),
                train_loss=train_loss,
                selection_value=sel,
                train_seconds=t_train,
                epoch_seconds=time.perf_counter() - t0,
            )
            history.append(m)
            evaluation = (m, pos, ret, eq, p, proba) if three else (m, pos, ret, eq, p)
            if stopper.update(epoch, sel, model, evaluation):
                break
        best_epoch, best_state, best_out = stopper.finish()
        best_out[0].update(leak_detector(best_out[4], host["y"], host["r1"], cfg))
        last_state = state_to_cpu(model)

    arch: dict[str, Any] = {"kind": "mlp", "in_dim": f, "hidden": list(cfg.hidden), "dropout": cfg.dropout}
    if three:  # (a binary model's entry stays as it was: out_dim 1 by default)
        arch.update(out_dim=3, classes=list(THREE_CLASSES), score="(1 + P(up) - P(down)) / 2")
    side = sidecar_base(rows, cfg, input_keys, arch)
    side.update(
        metrics=best_out[0],
        best_epoch=best_epoch,
        early_stopping={
            "metric": metric,
            "on": cfg.early_stopping,
            "fit_rows": fit_end,
            "inner_start": inner_start,
        },
        history=history,
        cuda_graph=runner.captured,
        blocks={"rows": rows.block_rows, "fit_blocks": len(spans), "source": rows.extra.get("rows", "")},
    )
    return finish_training(out_dir, best_state, last_state, side, best_out, best_epoch, history)
