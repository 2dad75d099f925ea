"""Memory across quarters (issue 10, "Scaling"): the feature stages of one quarter, run in a
process that already ran earlier quarters, leave nothing of that quarter referenced afterwards.

What ``bench_scaling`` measures (peak memory flat in the number of quarters) rests on this: a
module-level cache or a kept reference holding a quarter's arrays would add one quarter's worth
of memory per quarter. Traced with ``tracemalloc`` (numpy registers its buffers with it) and the
Arrow memory pool's own count; the stages run through ``benchmarks.stage_fns.run_quarters``,
which makes the assets' calls in the assets' order (warm-ups from the previous quarter included).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pyarrow as pa

from fx_assets_tests.conftest import make_market


def test_a_quarter_leaves_nothing_referenced_after_it(tmp_path: Path) -> None:
    from benchmarks.stage_fns import run_quarters

    root = make_market(tmp_path / "market", "2024-Q1:2024-Q3", scale=0.02, signal=0.0)
    out = tmp_path / "stages"
    # Q1 (cold) and Q2 (the first warm-up from a previous quarter) run every code path once:
    # imports, numba dispatch, lazily built tables; none of that is per-quarter data.
    run_quarters(root, out, ["2024-Q1", "2024-Q2"])
    gc.collect()
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        [q3] = run_quarters(root, out, ["2024-Q3"])
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert q3["warmed_up_from_previous_quarter"] and q3["trades_in_file"] > 100_000
    held = after - before
    # The quarter's own arrays are megabytes (peak); what may stay is bookkeeping (a few KB of
    # interned strings, logging records), never a share of the data.
    assert peak > 20 * 2**20, f"the quarter traced only {peak / 2**20:.1f} MiB: too small to tell"
    assert held < 0.01 * peak, f"{held / 2**20:.2f} MiB of {peak / 2**20:.1f} MiB still referenced"
    assert pa.total_allocated_bytes() == arrow_before
