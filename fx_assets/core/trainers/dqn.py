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

The fitted rows come as blocks (:mod:`fx_assets.core.trainers.rows`, resident or streamed):
the environments step inside the current block, so the replay buffer stores each transition's
inputs ``x[t]``, ``x[t+1]`` with ``(p, a, r)``, as a ring of device tensors (a streamed fold's
earlier blocks are gone from the device). Updates are double DQN (online argmax, target
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
from collections.abc import Iterable, Iterator, Sequence
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
from fx_assets.core.trainers.rows import FoldRows, Moments, Part, RowBlock, as_rows, block_order

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
    """Ring buffer of transitions on the device, pointer on the device: the state and next-state
    inputs (``x[t]``, ``x[t+1]``), position index, action and reward. States are stored, not
    row indices, because a streamed fold's earlier blocks are no longer on the device."""

    def __init__(self, capacity: int, n_features: int, device: torch.device) -> None:
        self.cap = capacity
        self.xs = torch.zeros((capacity, 2, n_features), dtype=torch.float32, device=device)
        self.pa = torch.zeros((capacity, 2), dtype=torch.long, device=device)
        self.r = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.ptr = torch.zeros((), dtype=torch.long, device=device)
        self.size = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(capacity, device=device)

    def push(
        self, xs: torch.Tensor, xs2: torch.Tensor, p: torch.Tensor, a: torch.Tensor, r: torch.Tensor
    ) -> None:
        """Write ``k`` transitions at ``ptr, ptr+1, …`` (mod capacity), in place, no host sync.

        With ``k <= cap`` (every configuration that validates: ``n_envs <= replay_size``) the
        slots are distinct, so an ``index_copy_`` writes them: O(k), capturable and
        deterministic on CUDA and CPU. A masked select over the ring (O(cap · width): with
        states stored it made a DQN epoch on the H200 4× slower) is kept only for ``k > cap``,
        where a slot is written by the last row that maps to it, as a sequential ring would.
        """
        k = p.shape[0]
        new_x = torch.stack([xs, xs2], dim=1)
        new_pa = torch.stack([p, a], dim=1)
        if k <= self.cap:
            idx = torch.remainder(self.ptr + torch.arange(k, device=p.device), self.cap)
            self.xs.index_copy_(0, idx, new_x)
            self.pa.index_copy_(0, idx, new_pa)
            self.r.index_copy_(0, idx, r)
        else:
            off = torch.remainder(self.slots - self.ptr, self.cap)
            write = off < k
            src = off + torch.div(k - 1 - off, self.cap, rounding_mode="floor").clamp_(min=0) * self.cap
            src = torch.where(write, src, torch.zeros_like(src))
            self.xs.copy_(torch.where(write[:, None, None], new_x[src], self.xs))
            self.pa.copy_(torch.where(write[:, None], new_pa[src], self.pa))
            self.r.copy_(torch.where(write, r[src], self.r))
        self.ptr.copy_(torch.remainder(self.ptr + k, self.cap))
        self.size.copy_(torch.clamp(self.size + k, max=self.cap))

    def sample(self, k: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """``k`` transitions (x, x_next, p, a, r) drawn uniformly (with replacement) from the
        filled part."""
        u = torch.rand(k, generator=gen, device=self.r.device, dtype=torch.float64)
        i = torch.minimum((u * self.size).long(), self.size - 1)
        x = self.xs[i]
        pa = self.pa[i]
        return x[:, 0], x[:, 1], pa[:, 0], pa[:, 1], self.r[i]


class VecEnv:
    """``n_envs`` copies of the trading environment over one block of training rows, stepped
    together.

    The environment reads its returns from ``r1`` (a persistent buffer, refilled per block) and
    steps actions at ``t <= last`` (a device scalar, ``rows in the block - 2``, so ``x[t + 1]``
    is in the block); the state tensors are updated in place, so a captured CUDA graph sees
    every step and every block.
    """

    def __init__(
        self, r1: torch.Tensor, n_envs: int, episode_len: int, cost: float, scale: float, gen: torch.Generator
    ) -> None:
        dev = r1.device
        self.r1 = r1
        self.last = torch.zeros((), dtype=torch.long, device=dev)
        self.n, self.episode_len, self.cost, self.scale, self.gen = n_envs, episode_len, cost, scale, gen
        self.t = torch.zeros(n_envs, dtype=torch.long, device=dev)
        self.p = torch.full((n_envs,), FLAT, dtype=torch.long, device=dev)
        self.steps = torch.zeros(n_envs, dtype=torch.long, device=dev)

    def load(self, r1: torch.Tensor) -> None:
        """Start a block: its 1-bar returns (an undefined one, across a roll, earns nothing),
        every env restarted flat at a random row of it."""
        m = int(r1.shape[0])
        if m < 2:
            raise FxDataError("VecEnv: fewer than 2 rows in a block")
        if r1.data_ptr() != self.r1.data_ptr():
            self.r1[:m].copy_(torch.nan_to_num(r1.to(torch.float32), nan=0.0))
        self.last.fill_(m - 2)
        self._reset(torch.ones(self.n, dtype=torch.bool, device=self.t.device), self.t, self.p, self.steps)

    def _reset(self, mask: torch.Tensor, t: torch.Tensor, p: torch.Tensor, steps: torch.Tensor) -> None:
        u = torch.rand(self.n, generator=self.gen, device=self.t.device, dtype=torch.float64)
        start = torch.minimum((u * (self.last + 1)).long(), self.last)
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


def reward_scale(rows: FoldRows, fit_end: int, cfg: TrainConfig) -> float:
    """``cfg.reward_scale``, else the std (ddof 1) of the finite 1-bar returns of the fitted
    rows, combined block by block (:class:`~fx_assets.core.trainers.rows.Moments`)."""
    if cfg.reward_scale is not None:
        return float(cfg.reward_scale)
    mom = Moments()
    for b in rows.blocks("train", rows.grid("train", 0, fit_end), with_x=False):
        mom.add(b.r1[torch.isfinite(b.r1)])
    if mom.n < 2:
        return math.nan
    return float(mom.var(correction=1).sqrt())


def train_dqn(
    fold: FoldData | FoldRows, cfg: TrainConfig, out_dir: Path | str, input_keys: Sequence[str]
) -> TrainResult:
    """Train the double-DQN agent on one fold; write best/last checkpoints under ``out_dir``.

    The fitted rows come as blocks (:mod:`~fx_assets.core.trainers.rows`), visited in a seeded
    order per epoch; the environments step inside the current block (a block change truncates
    every episode), and the replay holds transitions of every block seen. A resident fold with
    ``block_rows=None`` is one block, used in place.
    """
    rows = as_rows(fold, cfg.block_rows)
    dev = rows.device
    metric = cfg.metric_name()
    f = rows.n_features
    fit_end, inner_start = selection_split(rows, cfg)
    n_tr = rows.n_train
    spans = [s for s in rows.grid("train", 0, fit_end) if s[1] - s[0] >= 2]
    if not spans:
        raise FxDataError(f"fold {rows.keys}: no block of at least 2 fitted rows")
    host = rows.host_labels("val", 0, rows.n_val)
    inner = rows.host_labels("train", inner_start, n_tr)
    graphed = use_cuda_graph(dev)
    with seeded(cfg.seed, cfg.deterministic):
        in_dim = f + N_ACTIONS
        online = DuelingQNet(in_dim, cfg.hidden).to(dev)
        target = DuelingQNet(in_dim, cfg.hidden).to(dev)
        target.load_state_dict(online.state_dict())
        target.requires_grad_(False)
        opt = make_optimizer(online, cfg, capturable=graphed)
        gen = make_generator(dev, cfg.seed + 1_000_003)
        scale = reward_scale(rows, fit_end, cfg)  # the env never steps into the inner block
        if not math.isfinite(scale) or scale <= 0:
            raise FxDataError(f"fold {rows.keys}: training 1-bar returns have no spread (std {scale})")
        # A single stable block is used in place; otherwise each block is copied into one work
        # buffer (the captured graph reads fixed addresses).
        cap = max(b - a for a, b in spans)
        in_place = rows.stable and len(spans) == 1
        xw: dict[str, torch.Tensor] = {}
        if not in_place:
            xw["x"] = torch.empty((cap, f), dtype=torch.float32, device=dev)
        r1w = torch.zeros(cap, dtype=torch.float32, device=dev)
        env = VecEnv(r1w, cfg.n_envs, cfg.episode_len, cfg.cost, scale, gen)
        replay = _Replay(cfg.replay_size, f, dev)
        total_steps = cfg.max_steps_per_epoch or max(1, math.ceil(fit_end / cfg.n_envs))
        eye = torch.eye(N_ACTIONS, dtype=torch.float32, device=dev)
        updates_dev = torch.zeros((), dtype=torch.float64, device=dev)
        loss_sum = torch.zeros((), dtype=torch.float32, device=dev)
        tgt_params: list[torch.Tensor] = list(target.parameters())
        on_params: list[torch.Tensor] = list(online.parameters())

        def collect(eps: torch.Tensor | float) -> None:
            """Epsilon-greedy actions for every env, one env step, push the transitions."""
            x = xw["x"]
            with torch.no_grad():
                greedy = online(torch.cat([x[env.t], eye[env.p]], dim=1)).argmax(dim=1)
            rand = torch.randint(0, N_ACTIONS, (env.n,), generator=gen, device=dev)
            explore = torch.rand(env.n, generator=gen, device=dev) < eps
            t, p, a, r = env.step(torch.where(explore, rand, greedy))
            replay.push(x[t], x[t + 1], p, a, r)

        def iteration() -> None:
            """One training iteration: a fixed op sequence on persistent tensors, no host sync."""
            frac = torch.clamp(updates_dev / cfg.eps_decay_steps, max=1.0)
            collect((cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)).to(torch.float32))
            bx, bx2, bp, ba, br = replay.sample(cfg.batch_size, gen)
            q = (online(torch.cat([bx, eye[bp]], dim=1)) * eye[ba]).sum(dim=1)  # Q of the taken action
            with torch.no_grad():
                s2 = torch.cat([bx2, eye[ba]], dim=1)
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

        def load_block(blk: RowBlock) -> None:
            if in_place:
                xw.setdefault("x", blk.x)  # type: ignore[arg-type]
            else:
                xw["x"][: blk.n].copy_(blk.x)  # type: ignore[arg-type]
            env.load(blk.r1)

        runner = GraphRunner(iteration, dev, graphed, gen)
        updates = 0
        stopper = EarlyStopping(metric, cfg.patience, online)
        history: list[dict[str, float]] = []
        warmed = False
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            online.train()
            loss_sum.zero_()
            steps_done = 0
            order = block_order(len(spans), cfg.seed, epoch)
            for k, blk in enumerate(rows.blocks("train", spans, order)):
                if steps_done >= total_steps:
                    break
                load_block(blk)
                if not warmed:  # warm-up: uniform random actions, in the first block
                    for _ in range(math.ceil(min(cfg.learn_starts, cfg.replay_size) / cfg.n_envs)):
                        collect(1.0)
                    warmed = True
                # the epoch's steps shared by the blocks in proportion to their rows
                share = math.ceil(
                    total_steps * sum(b - a for a, b in (spans[i] for i in order[: k + 1])) / fit_end
                )
                steps = max(0, min(total_steps, share) - steps_done)
                runner.run(steps)
                steps_done += steps
            updates += steps_done
            train_loss = float(loss_sum) / max(1, steps_done)  # the epoch's one sync
            eps = cfg.eps_start + min(1.0, (updates - 1) / cfg.eps_decay_steps) * (
                cfg.eps_end - cfg.eps_start
            )
            t_train = time.perf_counter() - t0
            m, pos, ret, eq, score = evaluate_greedy(online, _xs(rows, "val", 0, rows.n_val), host, cfg)
            if cfg.early_stopping == "inner":
                sel = evaluate_greedy(online, _xs(rows, "train", inner_start, n_tr), inner, cfg)[0][metric]
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
        reward_scale=scale,
        updates=updates,
        cuda_graph=runner.captured,
        blocks={"rows": rows.block_rows, "fit_blocks": len(spans), "source": rows.extra.get("rows", "")},
    )
    return finish_training(out_dir, best_state, last_state, side, best_out, best_epoch, history)


def _xs(rows: FoldRows, part: Part, lo: int, hi: int) -> Iterator[torch.Tensor]:
    """The normalised inputs of rows ``[lo, hi)`` of ``part``, block by block."""
    for b in rows.block_list(part, lo, hi):
        assert b.x is not None
        yield b.x


def evaluate_greedy(
    model: torch.nn.Module,
    x: torch.Tensor | Iterable[torch.Tensor],
    block: dict[str, np.ndarray],
    cfg: TrainConfig,
) -> tuple[
    dict[str, float],
    npt.NDArray[np.int8],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
]:
    """Greedy policy on a run of bars (one tensor, or its row blocks in order): batched Q passes,
    one copy per block, a host scan over the whole run.

    (metrics, positions, net returns, equity, score); the score is Q(long) − Q(short) from flat.
    """
    tables, scores = [], []
    for xb in [x] if isinstance(x, torch.Tensor) else x:
        table_t, q = greedy_table(model, xb)
        tables.append(table_t.cpu().numpy())
        # Long-vs-short preference from flat, as a score for AUC against the sign of the target.
        scores.append((q[:, FLAT, 2] - q[:, FLAT, 0]).double().cpu().numpy())
    score = np.concatenate(scores) if scores else np.empty(0)
    table = np.concatenate(tables) if tables else np.empty((0, N_ACTIONS), np.int8)
    pos = resolve_positions(table, np.isfinite(block["r1"]))
    m, p, ret, eq = evaluate_positions(pos, block["r1"], block["sessions"], cfg.cost)
    m["auc"] = M.auc_returns(score, block["y"])
    m["auc_h1"] = M.auc_returns(score, block["r1"])
    return m, p, ret, eq, score
