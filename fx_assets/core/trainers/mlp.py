"""Supervised baseline: an MLP on the fold's normalised inputs predicting the sign of the target.

Owns the MLP trainer. Loss: BCE on ``1{y > 0}`` over training rows with ``y != 0`` (zero returns
carry no sign). Validation, on the validation quarter only: AUC of the predicted probability
against the sign of the target, and a trading evaluation of ``pos = sign(p − 0.5)`` (flat inside
``±eval_threshold``) earning ``pos · y^(1) − cost · |Δpos|`` per bar: daily Sharpe over the
session ids, max drawdown, hit rate, turnover. Early stopping keeps the best epoch by
``cfg.metric_name()``; best and last weights go to safetensors with a JSON sidecar.
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
    make_generator,
    make_optimizer,
    mlp_layers,
    seeded,
    selection_split,
    sidecar_base,
    state_to_cpu,
    use_cuda_graph,
)

_EVAL_CHUNK = 1 << 16


def build_mlp(arch: dict[str, Any]) -> torch.nn.Sequential:
    """Rebuild the network described by a sidecar's ``architecture`` entry."""
    if arch.get("kind") != "mlp":
        raise FxDataError(f"architecture {arch.get('kind')!r} is not an MLP")
    return mlp_layers(int(arch["in_dim"]), tuple(arch["hidden"]), 1, float(arch["dropout"]))


@torch.no_grad()
def predict_proba(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """P(y > 0) for each row of normalised inputs ``x`` (chunked, eval mode)."""
    was = model.training
    model.eval()
    out = torch.cat(
        [torch.sigmoid(model(x[i : i + _EVAL_CHUNK]).squeeze(1)) for i in range(0, x.shape[0], _EVAL_CHUNK)]
    )
    model.train(was)
    return out


def positions_from_proba(p: npt.NDArray[np.float64], threshold: float) -> npt.NDArray[np.int8]:
    pos = np.zeros(p.shape[0], dtype=np.int8)
    pos[p > 0.5 + threshold] = 1
    pos[p < 0.5 - threshold] = -1
    return pos


def block_metrics(
    p: npt.NDArray[np.float64], block: dict[str, np.ndarray], cfg: TrainConfig
) -> tuple[dict[str, float], npt.NDArray[np.int8], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """AUC and trading metrics of probabilities ``p`` on one block (validation or inner)."""
    m, pos, ret, eq = evaluate_positions(
        positions_from_proba(p, cfg.eval_threshold), block["r1"], block["sessions"], cfg.cost
    )
    m["auc"] = M.auc_returns(p, block["y"])  # against the training target's sign
    m["auc_h1"] = M.auc_returns(p, block["r1"])  # against the 1-bar return's sign
    return m, pos, ret, eq


def _host_block(y: torch.Tensor, r1: torch.Tensor, sessions: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": y.cpu().numpy(), "r1": r1.cpu().numpy(), "sessions": sessions}


def train_mlp(
    fold: FoldData, cfg: TrainConfig, out_dir: Path | str, input_keys: Sequence[str]
) -> TrainResult:
    """Train the MLP baseline on one fold; write best/last checkpoints under ``out_dir``."""
    dev = fold.device
    metric = cfg.metric_name()
    graphed = use_cuda_graph(dev)
    with seeded(cfg.seed, cfg.deterministic):
        model = mlp_layers(fold.n_features, cfg.hidden, 1, cfg.dropout).to(dev)
        opt = make_optimizer(model, cfg, capturable=graphed)
        gen = make_generator(dev, cfg.seed + 1_000_003)
        fit_end, inner_start = selection_split(fold, cfg)
        y = fold.y_train
        idx = torch.nonzero(torch.isfinite(y[:fit_end]) & (y[:fit_end] != 0)).squeeze(1)
        n = int(idx.numel())
        if n == 0:
            raise FxDataError(f"fold {fold.keys}: no training rows with a non-zero label")
        z = (y > 0).to(torch.float32)
        steps = math.ceil(n / cfg.batch_size)
        if cfg.max_steps_per_epoch is not None:
            steps = min(steps, cfg.max_steps_per_epoch)
        host = _host_block(fold.y_val, fold.r1_val, fold.val_sessions)
        inner = _host_block(
            fold.y_train[inner_start:], fold.r1_train[inner_start:], fold.train_sessions[inner_start:]
        )
        lossf = torch.nn.BCEWithLogitsLoss()
        # The step over full batches is a fixed op sequence on persistent tensors (the batch is
        # row ``s`` of the epoch's permutation, ``s`` a device counter), so on CUDA it is captured
        # once as a CUDA graph and replayed; a last partial batch runs eagerly.
        bs = cfg.batch_size
        full = n // bs
        perm_buf = torch.empty(n, dtype=torch.long, device=dev)
        batch_no = torch.zeros(1, dtype=torch.long, device=dev)
        loss_sum = torch.zeros((), device=dev)
        params = list(model.parameters())

        def learn(b: torch.Tensor) -> None:
            loss = lossf(model(fold.x_train[b]).squeeze(1), z[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            loss_sum.add_(loss.detach())

        def full_step() -> None:
            learn(perm_buf[: full * bs].view(full, bs).index_select(0, batch_no).view(bs))
            batch_no.add_(1)

        runner = GraphRunner(full_step, dev, graphed)
        stopper = EarlyStopping(metric, cfg.patience, model)
        history: list[dict[str, float]] = []
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            model.train()
            perm_buf.copy_(idx[torch.randperm(n, generator=gen, device=dev)])
            batch_no.zero_()
            loss_sum.zero_()
            runner.run(min(steps, full))
            if steps > full:  # the last, partial batch
                learn(perm_buf[full * bs :])
            train_loss = float(loss_sum) / steps  # the epoch's one sync
            t_train = time.perf_counter() - t0
            p = predict_proba(model, fold.x_val).double().cpu().numpy()
            m, pos, ret, eq = block_metrics(p, host, cfg)
            if cfg.early_stopping == "inner":
                pin = predict_proba(model, fold.x_train[inner_start:]).double().cpu().numpy()
                sel = block_metrics(pin, inner, cfg)[0][metric]
            else:
                sel = m[metric]
            m.update(
                epoch=float(epoch),
                train_loss=train_loss,
                selection_value=sel,
                train_seconds=t_train,
                epoch_seconds=time.perf_counter() - t0,
            )
            history.append(m)
            if stopper.update(epoch, sel, model, (m, pos, ret, eq)):
                break
        best_epoch, best_state, best_out = stopper.finish()
        last_state = state_to_cpu(model)

    arch = {"kind": "mlp", "in_dim": fold.n_features, "hidden": list(cfg.hidden), "dropout": cfg.dropout}
    side = sidecar_base(fold, cfg, input_keys, arch)
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
    )
    return finish_training(out_dir, best_state, last_state, side, best_out, best_epoch, history)
