"""The DQN replay ring: every write equals a sequential ring's (slot by slot, last write wins)."""

import numpy as np
import pytest
import torch

from fx_assets.core.trainers.dqn import _Replay


@pytest.mark.parametrize("cap,ks", [(7, [3, 3, 3, 5, 7, 1]), (5, [8, 2, 11]), (4, [4, 4, 1, 4])])
def test_ring_writes_equal_a_sequential_ring(cap: int, ks: list[int]) -> None:
    f = 3
    ring = _Replay(cap, f, torch.device("cpu"))
    ref_x = np.zeros((cap, 2, f), np.float32)
    ref_pa = np.zeros((cap, 2), np.int64)
    ref_r = np.zeros(cap, np.float32)
    ptr, size, n = 0, 0, 0
    rng = np.random.default_rng(0)
    for k in ks:
        xs, xs2 = rng.normal(size=(k, f)).astype(np.float32), rng.normal(size=(k, f)).astype(np.float32)
        p, a = rng.integers(0, 3, k), rng.integers(0, 3, k)
        r = (np.arange(k) + n).astype(np.float32)
        ring.push(*(torch.from_numpy(v) for v in (xs, xs2, p, a, r)))
        for j in range(k):  # the sequential reference
            s = (ptr + j) % cap
            ref_x[s, 0], ref_x[s, 1], ref_pa[s], ref_r[s] = xs[j], xs2[j], (p[j], a[j]), r[j]
        ptr, size, n = (ptr + k) % cap, min(size + k, cap), n + k
        assert int(ring.ptr) == ptr and int(ring.size) == size
        np.testing.assert_array_equal(ring.xs.numpy(), ref_x)
        np.testing.assert_array_equal(ring.pa.numpy(), ref_pa)
        np.testing.assert_array_equal(ring.r.numpy(), ref_r)
