"""What the signal report's three-class metrics cost: one model scored binary only (no class
probabilities) against the same model with ``[n, 3]`` class probabilities, and, when
``--baseline REV`` names a revision, that revision's ``core/signal_report.py`` on the
three-class case (loaded from git beside the current one), alternating A B C in one process.

Synthetic inputs: ``--rows`` validation rows, labels +1 / 0 / -1 in runs of 10 rows, Dirichlet
probabilities, horizons 10 / 50 / 100, three regime variables (16 cells per horizon),
``n_boot`` 30, ``n_perm`` 30. With a baseline it also checks that both revisions give the same
figures (``identical_figures``).

    python -m benchmarks.bench_signal_three_class [--rows N] [--rounds R] [--baseline REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from benchmarks.common import alternate, command_line, git_commit, timed, write_result
from fx_assets.core import signal_report as current


def _module_at(rev: str, tmp: Path) -> ModuleType:
    src = subprocess.run(
        ["git", "show", f"{rev}:fx_assets/core/signal_report.py"], capture_output=True, text=True, check=True
    ).stdout
    path = tmp / "signal_report_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("signal_report_baseline", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _same(a: Any, b: Any) -> bool:
    """Every field of every cell equal (NaN equal to NaN)."""
    for ca, cb in zip(a.cells, b.cells, strict=True):
        for f in (fl.name for fl in dataclasses.fields(ca)):
            x, y = getattr(ca, f), getattr(cb, f)
            if not (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="git revision whose signal_report.py to compare")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    n = a.rows
    y = np.repeat(rng.choice([1.0, 0.0, -1.0], -(-n // 10)), 10)[:n]
    p = rng.dirichlet([1.0, 1.0, 1.0], n)
    score = 0.5 * (1.0 + p[:, 0] - p[:, 2])
    regimes = {k: rng.random(n) for k in ("spread", "realised_vol", "event_rate")}
    tmp = Path(tempfile.mkdtemp(prefix="bench_three_"))
    mods: dict[str, tuple[ModuleType, bool]] = {"binary": (current, False), "three_class": (current, True)}
    if a.baseline:
        mods["three_class_baseline"] = (_module_at(a.baseline, tmp), True)
    reports: dict[str, Any] = {}

    def case(name: str, mod: ModuleType, three: bool) -> Any:
        unit = {
            "s": mod.RowUnitData(
                labels={h: y for h in (10, 50, 100)}, regimes_valid=regimes, regimes_train=regimes
            )
        }
        cfg = mod.SignalReportConfig(n_boot=30, n_perm=30)
        prob = {("s", "m"): p} if three else None

        def one() -> dict[str, float]:
            fig, reports[name] = timed(lambda: mod.signal_report({("s", "m"): score}, unit, cfg, prob))
            return fig

        return one

    res = alternate({k: case(k, m, t) for k, (m, t) in mods.items()}, rounds=a.rounds)
    out: dict[str, Any] = {
        "command": command_line(),
        "commit": git_commit(),
        "baseline": a.baseline,
        "rows": n,
        "cells_per_model": 3 * 16,
        "results": res,
        "ratio_three_class_vs_binary_wall": round(
            res["three_class"]["wall_s"]["median"] / res["binary"]["wall_s"]["median"], 2
        ),
    }
    if a.baseline:
        b = res["three_class_baseline"]
        out["ratio_baseline_vs_current_wall"] = round(
            b["wall_s"]["median"] / res["three_class"]["wall_s"]["median"], 2
        )
        out["ratio_baseline_vs_current_cpu"] = round(
            b["cpu_s"]["median"] / res["three_class"]["cpu_s"]["median"], 2
        )
        out["identical_figures"] = _same(reports["three_class_baseline"], reports["three_class"])
    path = write_result("bench_signal_three_class", out)
    print(path)


if __name__ == "__main__":
    main()
