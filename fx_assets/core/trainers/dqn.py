"""Double-DQN trading agent with a dueling head and a vectorised on-device environment.

Owns the RL trainer. The market is exogenous (our orders do not move it), so the environment
is a pure function of the fold's resident arrays and can be stepped for ``n_envs`` start
indices at once with tensor ops:

- state at bar ``t`` with current position ``p``: the normalised inputs ``x[t]`` and a one-hot
  of ``p ∈ {−1, 0, +1}``; never a raw price;
- action ``a ∈ {short, flat, long}`` sets the new position ``p' = a − 1``;
- reward ``p' · y^(1)_t − cost · |p' − p|`` (divided by ``reward_scale`` so Q-values are O(1));
- next state ``(x[t+1], p')``. Episodes are truncated after ``episode_len`` bars or at the end of
  the training rows; truncation is not termination (the market goes on), so every transition
  bootstraps.

The replay buffer stores only ``(t, p, a, r)`` per transition (states are rebuilt from the
resident ``x``), as a ring of device tensors. Updates are double DQN (online argmax, target
value) with a Huber loss and a soft (``tau``) or periodic hard target update.

One training iteration (act, step the environments, push, sample, learn, update the target)
is a fixed sequence of device ops on persistent tensors with no host sync: the write pointer,
fill level, update count and epsilon live on the device, the ring write is a masked select
(deterministic, no scatter) and the Q of the taken action is picked by a one-hot product
(its backward is elementwise, not a scatter). So on CUDA the iteration is captured once as a
CUDA graph and replayed ``steps`` times per epoch (a few µs of launch instead of ~150
kernel launches from Python); the first iterations run eagerly on a side stream as the
capture warm-up. On the CPU, or with ``FX_CUDA_GRAPHS=0``, the same function runs eagerly.

Validation runs the greedy policy over the validation quarter without a Python loop over bars
on the device: Q is evaluated for all three possible current positions of every bar in one
batch, the greedy action table ``[n, 3]`` is copied to the host once, and the position path is
resolved by a numba scan (``p_{t} = table[t, p_{t−1}]``).
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
    seeded,
    selection_split,
    sidecar_base,
    state_to_cpu,
    use_cuda_graph,
)

N_ACTIONS = 3  # short, flat, long; position = action index - 1
FLAT = 1
_EVAL_CHUNK = 1 << 18  # bars per Q pass (x3 positions) in evaluation


class DuelingQNet(torch.nn.Module):
    """ReLU trunk, then ``Q = V + A − mean(A)`` over the three actions."""

    def __init__(self, in_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        d = in_dim
        for h in hidden:
            layers += [torch.nn.Linear(d, h), torch.nn.ReLU()]
            d = h
        self.trunk = torch.nn.Sequential(*layers)
        self.value = torch.nn.Linear(d, 1)
        self.advantage = torch.nn.Linear(d, N_ACTIONS)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        h = self.trunk(s)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)


def build_qnet(arch: dict[str, Any]) -> DuelingQNet:
    """Rebuild the network described by a sidecar's ``architecture`` entry."""
    if arch.get("kind") != "dueling_dqn":
        raise FxDataError(f"architecture {arch.get('kind')!r} is not a dueling DQN")
    return DuelingQNet(int(arch["in_dim"]), tuple(arch["hidden"]))


def make_states(x: torch.Tensor, t: torch.Tensor, pos_idx: torch.Tensor) -> torch.Tensor:
    """``[x[t], onehot(pos_idx)]`` for index tensors ``t`` and ``pos_idx`` (0, 1, 2)."""
    onehot = torch.nn.functional.one_hot(pos_idx, N_ACTIONS).to(x.dtype)
    return torch.cat([x[t], onehot], dim=1)


@torch.no_grad()
def greedy_table(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy action for every (bar, current position) — ``[n, 3]`` int8 — and Q ``[n, 3, 3]``."""
    was = model.training
    model.eval()
    n = x.shape[0]
    qs = []
    for i in range(0, n, _EVAL_CHUNK):
        xc = x[i : i + _EVAL_CHUNK]
        m = xc.shape[0]
        t = torch.arange(m, device=x.device).repeat_interleave(N_ACTIONS)
        p = torch.arange(N_ACTIONS, device=x.device).repeat(m)
        qs.append(model(make_states(xc, t, p)).view(m, N_ACTIONS, N_ACTIONS))
    q = torch.cat(qs)
    model.train(was)
    return q.argmax(dim=2).to(torch.int8), q


@njit(cache=True)
def _resolve_path_nb(table: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    n = table.shape[0]
    out = np.empty(n, dtype=np.int8)
    p = 1
    for t in range(n):
        a = table[t, p] if allowed[t] else 1  # flat where the bar's return is undefined
        out[t] = a - 1
        p = a
    return out


def resolve_positions(table: npt.NDArray[np.int8], allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.int8]:
    """Sequential greedy positions (−1/0/+1) from a ``[n, 3]`` action table, starting flat."""
    if table.ndim != 2 or table.shape[1] != N_ACTIONS or allowed.shape != (table.shape[0],):
        raise FxDataError(f"resolve_positions: table {table.shape}, allowed {allowed.shape}")
    return _resolve_path_nb(np.ascontiguousarray(table, dtype=np.int8), np.ascontiguousarray(allowed))


class _Replay:
    """Ring buffer of (t, position index, action) and reward on the device, pointer on the device."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.cap = capacity
        self.tpa = torch.zeros((capacity, 3), dtype=torch.long, device=device)
        self.r = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.ptr = torch.zeros((), dtype=torch.long, device=device)
        self.size = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(capacity, device=device)

    def push(self, t: torch.Tensor, p: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> None:
        """Write ``k`` transitions at ``ptr, ptr+1, …`` (mod capacity), in place, no host sync.

        On CUDA the write is a masked select over the ring (capturable, deterministic, O(cap)):
        slot ``s`` receives new row ``(s − ptr) mod cap`` when that is ``< k``; if ``k > cap`` a
        slot is written by the last row that maps to it, as a sequential ring would. On the CPU
        the same slots are written by index (O(k)).
        """
        k = t.shape[0]
        if self.r.device.type != "cuda":  # no graph to capture: a plain O(k) ring write (CPU)
            idx = torch.remainder(self.ptr + torch.arange(k, device=t.device), self.cap)
            self.tpa[idx] = torch.stack([t, p, a], dim=1)  # sequential: the last duplicate wins
            self.r[idx] = r
            self.ptr.copy_(torch.remainder(self.ptr + k, self.cap))
            self.size.copy_(torch.clamp(self.size + k, max=self.cap))
            return
        off = torch.remainder(self.slots - self.ptr, self.cap)
        write = off < k
        src = off + torch.div(k - 1 - off, self.cap, rounding_mode="floor").clamp_(min=0) * self.cap
        src = torch.where(write, src, torch.zeros_like(src))
        new = torch.stack([t, p, a], dim=1)
        self.tpa.copy_(torch.where(write[:, None], new[src], self.tpa))
        self.r.copy_(torch.where(write, r[src], self.r))
        self.ptr.copy_(torch.remainder(self.ptr + k, self.cap))
        self.size.copy_(torch.clamp(self.size + k, max=self.cap))

    def sample(self, k: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """``k`` transitions drawn uniformly (with replacement) from the filled part."""
        u = torch.rand(k, generator=gen, device=self.r.device, dtype=torch.float64)
        i = torch.minimum((u * self.size).long(), self.size - 1)
        row = self.tpa[i]
        return row[:, 0], row[:, 1], row[:, 2], self.r[i]


class VecEnv:
    """``n_envs`` copies of the trading environment over the training rows, stepped together.

    The state tensors are updated in place, so a captured CUDA graph sees every step.
    """

    def __init__(
        self, r1: torch.Tensor, n_envs: int, episode_len: int, cost: float, scale: float, gen: torch.Generator
    ) -> None:
        # an undefined return (a label across a contract roll) earns nothing
        self.r1 = torch.nan_to_num(r1.to(torch.float32), nan=0.0)
        self.last = int(r1.shape[0]) - 2  # actions at t <= last, so x[t + 1] exists
        if self.last < 0:
            raise FxDataError("VecEnv: fewer than 2 training rows")
        self.n, self.episode_len, self.cost, self.scale, self.gen = n_envs, episode_len, cost, scale, gen
        dev = r1.device
        self.t = torch.zeros(n_envs, dtype=torch.long, device=dev)
        self.p = torch.full((n_envs,), FLAT, dtype=torch.long, device=dev)
        self.steps = torch.zeros(n_envs, dtype=torch.long, device=dev)
        self._reset(torch.ones(n_envs, dtype=torch.bool, device=dev), self.t, self.p, self.steps)

    def _reset(self, mask: torch.Tensor, t: torch.Tensor, p: torch.Tensor, steps: torch.Tensor) -> None:
        start = torch.randint(0, self.last + 1, (self.n,), generator=self.gen, device=self.t.device)
        self.t.copy_(torch.where(mask, start, t))
        self.p.copy_(torch.where(mask, torch.full_like(p, FLAT), p))
        self.steps.copy_(torch.where(mask, torch.zeros_like(steps), steps))

    def step(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply actions; return the transitions (t, p, a, reward) and advance/reset the envs."""
        t, p = self.t.clone(), self.p.clone()
        r = (
            (a - 1).to(torch.float32) * self.r1[t] - self.cost * (a - p).abs().to(torch.float32)
        ) / self.scale
        t1, s1 = t + 1, self.steps + 1
        self._reset((t1 > self.last) | (s1 >= self.episode_len), t1, a, s1)
        return t, p, a, r


def train_dqn(
    fold: FoldData, cfg: TrainConfig, out_dir: Path | str, input_keys: Sequence[str]
) -> TrainResult:
    """Train the double-DQN agent on one fold; write best/last checkpoints under ``out_dir``."""
    dev = fold.device
    metric = cfg.metric_name()
    x = fold.x_train
    fit_end, inner_start = selection_split(fold, cfg)
    host = _host_block(fold.y_val, fold.r1_val, fold.val_sessions)
    inner = _host_block(
        fold.y_train[inner_start:], fold.r1_train[inner_start:], fold.train_sessions[inner_start:]
    )
    graphed = use_cuda_graph(dev)
    with seeded(cfg.seed, cfg.deterministic):
        in_dim = fold.n_features + N_ACTIONS
        online = DuelingQNet(in_dim, cfg.hidden).to(dev)
        target = DuelingQNet(in_dim, cfg.hidden).to(dev)
        target.load_state_dict(online.state_dict())
        target.requires_grad_(False)
        opt = make_optimizer(online, cfg, capturable=graphed)
        gen = make_generator(dev, cfg.seed + 1_000_003)
        r1_train = fold.r1_train[:fit_end]  # the env never steps into the inner block
        finite_r1 = r1_train[torch.isfinite(r1_train)]
        scale = cfg.reward_scale if cfg.reward_scale is not None else float(finite_r1.std())
        if not math.isfinite(scale) or scale <= 0:
            raise FxDataError(f"fold {fold.keys}: training 1-bar returns have no spread (std {scale})")
        env = VecEnv(r1_train, cfg.n_envs, cfg.episode_len, cfg.cost, scale, gen)
        replay = _Replay(cfg.replay_size, dev)
        steps = cfg.max_steps_per_epoch or max(1, math.ceil(fit_end / cfg.n_envs))
        eye = torch.eye(N_ACTIONS, dtype=x.dtype, device=dev)
        updates_dev = torch.zeros((), dtype=torch.float64, device=dev)
        loss_sum = torch.zeros((), dtype=torch.float32, device=dev)
        tgt_params: list[torch.Tensor] = list(target.parameters())
        on_params: list[torch.Tensor] = list(online.parameters())

        def states(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return torch.cat([x[t], eye[p]], dim=1)

        def collect(eps: torch.Tensor | float) -> None:
            """Epsilon-greedy actions for every env, one env step, push the transitions."""
            with torch.no_grad():
                greedy = online(states(env.t, env.p)).argmax(dim=1)
            rand = torch.randint(0, N_ACTIONS, (env.n,), generator=gen, device=dev)
            explore = torch.rand(env.n, generator=gen, device=dev) < eps
            replay.push(*env.step(torch.where(explore, rand, greedy)))

        def iteration() -> None:
            """One training iteration: a fixed op sequence on persistent tensors, no host sync."""
            frac = torch.clamp(updates_dev / cfg.eps_decay_steps, max=1.0)
            collect((cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)).to(torch.float32))
            bt, bp, ba, br = replay.sample(cfg.batch_size, gen)
            q = (online(states(bt, bp)) * eye[ba]).sum(dim=1)  # Q of the taken action
            with torch.no_grad():
                s2 = states(bt + 1, ba)
                a2 = online(s2).argmax(dim=1, keepdim=True)  # double DQN: online picks ...
                q2 = target(s2).gather(1, a2).squeeze(1)  # ... target evaluates
                y = br + cfg.gamma * q2
            loss = torch.nn.functional.smooth_l1_loss(q, y, beta=cfg.huber_delta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(on_params, cfg.grad_clip)
            opt.step()
            updates_dev.add_(1.0)
            with torch.no_grad():
                if cfg.tau > 0:
                    torch._foreach_lerp_(tgt_params, on_params, cfg.tau)
                else:  # hard copy every target_period updates, decided on the device
                    hit = torch.remainder(updates_dev, cfg.target_period) == 0
                    for tp, op in zip(tgt_params, on_params, strict=True):
                        tp.copy_(torch.where(hit, op, tp))
                loss_sum.add_(loss.detach())

        for _ in range(math.ceil(min(cfg.learn_starts, cfg.replay_size) / cfg.n_envs)):
            collect(1.0)  # warm-up: uniform random actions

        runner = GraphRunner(iteration, dev, graphed, gen)
        updates = 0
        stopper = EarlyStopping(metric, cfg.patience, online)
        history: list[dict[str, float]] = []
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            online.train()
            loss_sum.zero_()
            runner.run(steps)
            updates += steps
            train_loss = float(loss_sum) / steps  # the epoch's one sync
            eps = cfg.eps_start + min(1.0, (updates - 1) / cfg.eps_decay_steps) * (
                cfg.eps_end - cfg.eps_start
            )
            t_train = time.perf_counter() - t0
            m, pos, ret, eq, score = evaluate_greedy(online, fold.x_val, host, cfg)
            if cfg.early_stopping == "inner":
                sel = evaluate_greedy(online, x[inner_start:], inner, cfg)[0][metric]
            else:
                sel = m[metric]
            m.update(
                selection_value=sel,
                epoch=float(epoch),
                train_loss=train_loss,
                epsilon=eps,
                train_seconds=t_train,
                epoch_seconds=time.perf_counter() - t0,
            )
            history.append(m)
            if stopper.update(epoch, sel, online, (m, pos, ret, eq, score)):
                break
        best_epoch, best_state, best_out = stopper.finish()
        best_out[0].update(leak_detector(best_out[4], host["y"], host["r1"], cfg))
        last_state = state_to_cpu(online)

    arch = {"kind": "dueling_dqn", "in_dim": in_dim, "hidden": list(cfg.hidden), "actions": [-1, 0, 1]}
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
        reward_scale=scale,
        updates=updates,
        cuda_graph=runner.captured,
    )
    return finish_training(out_dir, best_state, last_state, side, best_out, best_epoch, history)


def _host_block(y: torch.Tensor, r1: torch.Tensor, sessions: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": y.cpu().numpy(), "r1": r1.cpu().numpy(), "sessions": sessions}


def evaluate_greedy(
    model: torch.nn.Module, x: torch.Tensor, block: dict[str, np.ndarray], cfg: TrainConfig
) -> tuple[
    dict[str, float],
    npt.NDArray[np.int8],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
]:
    """Greedy policy on one block of bars: one batched Q pass, one copy, a host scan.

    (metrics, positions, net returns, equity, score); the score is Q(long) − Q(short) from flat.
    """
    table_t, q = greedy_table(model, x)
    # Long-vs-short preference from flat, as a score for AUC against the sign of the target.
    score = (q[:, FLAT, 2] - q[:, FLAT, 0]).double().cpu().numpy()
    pos = resolve_positions(table_t.cpu().numpy(), np.isfinite(block["r1"]))
    m, p, ret, eq = evaluate_positions(pos, block["r1"], block["sessions"], cfg.cost)
    m["auc"] = M.auc_returns(score, block["y"])
    m["auc_h1"] = M.auc_returns(score, block["r1"])
    return m, p, ret, eq, score
