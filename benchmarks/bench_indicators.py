"""Indicator benchmark: fx_assets' roll-adjusted Wilder/TA kernels against TA-Lib on the same bars.

Bars: the volume bars of one ``--scale 1`` quarter (the scale-out benchmark's derived bars when
they exist, else a synthetic series of 490 000 bars on a 0.25 tick grid with one roll). The
arrays are saved as .npy; TA-Lib runs in its own virtual environment
(``benchmarks/.venvs/talib``, created from PyPI on first use: TA-Lib is not a dependency of the
project's runtime). Each side is a server process of the same shape (the project's python for
fx_assets, the venv's for TA-Lib) that reads the arrays once and times calls on request, with
the same glibc malloc settings (``MALLOC_ENV``). Each round times one fx_assets call, then one
TA-Lib call (A B A B), each as the best of ``INNER`` back-to-back calls; every figure is {min,
median, max, rounds} over the rounds, wall and CPU (user + sys of the server).

Agreement: TA-Lib knows no rolls, so the outputs (saved by the two servers) are compared on
the same prices with one instrument id throughout, after each feature's burn-in (its registry ``window``): max |delta|
in the units of the fx_assets output. RSI bars where TA-Lib's flat-window value (0) differs
from ours (50) and Bollinger bars with an empty band are left out of the comparison.

Usage: ``python -m benchmarks.bench_indicators [--rounds N]`` -> results/bench_indicators.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ROOT, command_line, load_average, target, write_result

BARS_GLOB = "/work/main/benchmarks/data/scaleout_scale1/derived/bars/ES.FUT/ES.FUT_*.arrow"
TALIB_VENV = ROOT / ".venvs" / "talib"
TALIB_PIN = "TA-Lib==0.8.2"  # the version of the dev environment (pyproject: ta-lib>=0.5)
INNER = 3  # calls per timing: the best of them (the shared machine preempts single calls)
SYNTH_BARS = 490_000

# Both sides run as server processes of the same shape: each reads the arrays once, then
# answers one line (indicator name) with one JSON line (wall and CPU seconds, best of `inner`).
# The side's code defines `fns` (name -> call) and `versions`.
_TALIB_SIDE = r"""
import talib
def bb():
    up, _mid, dn = talib.BBANDS(c, 20, 2.0, 2.0, talib.MA_Type.SMA)
    return (c - dn) / (up - dn)
fns = {
    "adx": lambda: talib.ADX(h, l, c, 14),
    "dmi": lambda: (talib.PLUS_DI(h, l, c, 14), talib.MINUS_DI(h, l, c, 14), talib.ADX(h, l, c, 14)),
    "rsi": lambda: talib.RSI(c, 14),
    "natr": lambda: talib.NATR(h, l, c, 14),
    "macd": lambda: tuple(x / c for x in talib.MACD(c, 12, 26, 9)),
    "bb_pctb": bb,
}
versions = {"talib": talib.__version__, "numpy": np.__version__}
"""
_FX_SIDE = r"""
from fx_assets.core import bar_features as bf
fns = {
    "adx": lambda: bf.adx(o, h, l, c, inst, 14),
    "dmi": lambda: bf.dmi(o, h, l, c, inst, 14),
    "rsi": lambda: bf.rsi(o, c, inst, 14),
    "natr": lambda: bf.natr(o, h, l, c, inst, 14),
    "macd": lambda: bf.macd(o, c, inst, 12, 26, 9),
    "bb_pctb": lambda: bf.bollinger_pctb(o, c, inst, 20, 2.0),
}
versions = {"numpy": np.__version__}
"""
_SERVER = r"""
import json, resource, sys, time
import numpy as np
d = sys.argv[1]
o, h, l, c, inst = (np.load(f"{d}/{k}.npy") for k in ("open", "high", "low", "close", "inst"))
exec(sys.argv[2])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
print(json.dumps(versions), flush=True)
for line in sys.stdin:
    name, inner = line.split()
    if name == "save":
        with np.errstate(all="ignore"):
            for k, f in fns.items():
                out = f()
                out = out if isinstance(out, tuple) else (out,)
                for i, a in enumerate(out):
                    np.save(f"{d}/{sys.argv[3]}_{k}_{i}.npy", a)
        print("{}", flush=True)
        continue
    best_w = best_c = best_f = float("inf")
    with np.errstate(all="ignore"):
        for _ in range(int(inner)):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, t0 = cpu(), time.perf_counter()
            fns[name]()
            best_w = min(best_w, time.perf_counter() - t0)
            best_c = min(best_c, cpu() - c0)
            best_f = min(best_f, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(json.dumps({"wall": best_w, "cpu": best_c, "faults": best_f}), flush=True)
"""
# The same glibc malloc policy in both servers: freed outputs stay in the heap (no mmap, no
# trim), so each call writes into memory the previous call freed. With glibc's dynamic
# thresholds, whether a freed output was unmapped or trimmed (and faulted back in at the next
# call, ~1-2 us a page here) depended on each process's heap history: in the in-process
# version of this benchmark MACD's and DMI's outputs were faulted in at every call (1,882
# faults) and NATR's never, with the same kernels faulting nothing in a process of their own.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20)}


def rounds_summary(values: list[float], digits: int = 6) -> dict[str, Any]:
    """{min, median, max, rounds} of repeated timings."""
    return {
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
        "rounds": len(values),
    }


def ensure_talib_venv() -> Path:
    """The TA-Lib venv's python, created / updated from PyPI (pinned, numpy as ours) if needed."""
    py = TALIB_VENV / "bin" / "python"
    version = TALIB_PIN.split("==")[1]
    probe = [str(py), "-c", f"import talib, numpy; assert talib.__version__ == {version!r}"]
    if py.is_file() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return py
    print(f"[indicators] setting up {TALIB_VENV} ({TALIB_PIN})", file=sys.stderr, flush=True)
    if not py.is_file():
        subprocess.run(["python3", "-m", "venv", str(TALIB_VENV)], check=True)
    pins = [TALIB_PIN, f"numpy=={np.__version__}"]
    subprocess.run([str(py), "-m", "pip", "install", "-q", *pins], check=True)
    return py


def load_bars() -> tuple[dict[str, np.ndarray], str]:
    """open/high/low/close/inst of the benchmark bars, and where they came from."""
    import glob

    from fx_assets.core.bars import BarTable
    from fx_assets.core.tables import read_table

    found = sorted(glob.glob(BARS_GLOB))
    if found:
        b = BarTable.from_arrow(read_table(Path(found[0])), found[0])
        cols = {"open": b.open, "high": b.high, "low": b.low, "close": b.close, "inst": b.instrument_id}
        # copies in numpy's own memory, as TA-Lib's side has them (np.load): the columns of a
        # memory-mapped Arrow file sit in 4 KiB page-cache pages, numpy's large arrays in
        # (transparent) huge pages, which alone made the same kernel ~15% slower on them
        return {k: np.array(v, copy=True) for k, v in cols.items()}, found[0]
    rng = np.random.default_rng(0)
    n = SYNTH_BARS
    c = 4500.0 * np.exp(np.cumsum(rng.normal(0, 3e-4, n)))
    inst = np.ones(n, np.uint32)
    inst[n // 2 :] = 2
    c[n // 2 :] *= 1.01
    o = np.r_[c[0], c[:-1]] * np.exp(rng.normal(0, 1e-4, n))
    tick = 0.25
    o, c = np.round(o / tick) * tick, np.round(c / tick) * tick
    h = np.maximum(o, c) + tick * rng.integers(0, 3, n)
    lo = np.minimum(o, c) - tick * rng.integers(0, 3, n)
    return {"open": o, "high": h, "low": lo, "close": c, "inst": inst}, f"synthetic GBM, {n} bars, 1 roll"


DESCRIPTIONS = {
    "adx": "ADX(14) alone; TA-Lib ADX",
    "dmi": "+DI, -DI and ADX (what the feature table needs); TA-Lib PLUS_DI + MINUS_DI + ADX",
    "rsi": "RSI(14); TA-Lib RSI",
    "natr": "NATR(14); TA-Lib NATR",
    "macd": "MACD(12, 26, 9) line, signal, histogram divided by C (the feature columns); "
    "TA-Lib MACD then / C in numpy",
    "bb_pctb": "Bollinger %b(20, 2); TA-Lib BBANDS then (C - lower) / (upper - lower) in numpy",
}
# feature whose registry window is the burn-in of each compared output
BURN_IN_FEATURE = {
    "adx": ["adx_14"],
    "dmi": ["plus_di_14", "minus_di_14", "adx_14"],
    "rsi": ["rsi_14"],
    "natr": ["natr_14"],
    "macd": ["macd_12_26", "macd_signal_9", "macd_hist"],
    "bb_pctb": ["bb_pctb_20"],
}


def agreement(d: Path, ours: Path) -> dict[str, Any]:
    """max |fx - TA-Lib| after burn-in: the outputs the two servers saved (``talib_*`` and
    ``fx_*`` in ``d``), both computed with one instrument id (TA-Lib knows no rolls)."""
    from fx_assets.core.bar_features import build_registry

    windows = {s.name: s.window for s in build_registry()}
    out: dict[str, Any] = {}
    for name in DESCRIPTIONS:
        worst = 0.0
        compared = 0
        for i, feature in enumerate(BURN_IN_FEATURE[name]):
            ref = np.load(d / f"talib_{name}_{i}.npy")
            g = np.load(ours / f"fx_{name}_{i}.npy")
            ok = np.zeros(g.shape, bool)
            ok[windows[feature] :] = True
            ok &= np.isfinite(ref)
            if name == "rsi":
                ok &= ~((ref == 0.0) & (g == 50.0))  # flat window: TA-Lib 0, ours 50
            if name == "bb_pctb":
                ok &= ~(g == 0.5) | np.isfinite(ref)
            if not np.isfinite(g[ok]).all():
                raise AssertionError(f"{name}[{i}]: NaN where TA-Lib has a value")
            worst = max(worst, float(np.max(np.abs(g[ok] - ref[ok]))))
            compared += int(ok.sum())
        out[name] = {"max_abs_delta_after_burn_in": worst, "values_compared": compared}
    return out


class Server:
    """One side's server process (``_SERVER`` running ``side`` on the arrays in ``d``)."""

    def __init__(self, python: str, side: str, d: Path, prefix: str, malloc: dict[str, str]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
        self.proc = subprocess.Popen(
            [python, "-c", _SERVER, str(d), side, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT.parent,
            env=dict(env, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **malloc),
        )
        self.versions = json.loads(self._line())

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"indicator server exited with {self.proc.wait()}")
        return line

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._line()

    def time(self, name: str) -> dict[str, float]:
        return json.loads(self.ask(f"{name} {INNER}"))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def time_sides(talib_python: str, d: Path, rounds: int, malloc: dict[str, str]) -> dict[str, Any]:
    """Per indicator: ``rounds`` rounds of one fx_assets timing then one TA-Lib timing, each
    side in its own server with the malloc settings ``malloc``."""
    talib_side = Server(talib_python, _TALIB_SIDE, d, "talib", malloc)
    fx_side = Server(sys.executable, _FX_SIDE, d, "fx", malloc)
    for name in DESCRIPTIONS:  # compile / warm both sides before timing
        fx_side.time(name)
        talib_side.time(name)
    figures: dict[str, Any] = {}
    for name in DESCRIPTIONS:
        fx_w, fx_c, ta_w, ta_c, ratio_w, fx_f, ta_f = [], [], [], [], [], [], []
        for _ in range(rounds):  # A B A B
            a = fx_side.time(name)
            b = talib_side.time(name)
            fx_w.append(a["wall"])
            fx_c.append(a["cpu"])
            fx_f.append(a["faults"])
            ta_w.append(b["wall"])
            ta_c.append(b["cpu"])
            ta_f.append(b["faults"])
            ratio_w.append(a["wall"] / b["wall"])
        figures[name] = {
            "what": DESCRIPTIONS[name],
            "fx_assets_wall_s": rounds_summary(fx_w),
            "talib_wall_s": rounds_summary(ta_w),
            "fx_assets_cpu_s": rounds_summary(fx_c),
            "talib_cpu_s": rounds_summary(ta_c),
            "fx_assets_page_faults_per_call": rounds_summary(fx_f, 0),
            "talib_page_faults_per_call": rounds_summary(ta_f, 0),
            "ratio_per_round": rounds_summary(ratio_w, 3),
            "ratio_of_medians": round(statistics.median(fx_w) / statistics.median(ta_w), 3),
            "ratio_of_mins": round(min(fx_w) / min(ta_w), 3),
        }
    fx_side.close()
    talib_side.close()
    return figures


def run(rounds: int) -> dict[str, Any]:
    load_before = load_average()
    t_start = time.perf_counter()
    py = ensure_talib_venv()
    arrays, source = load_bars()
    n = int(arrays["close"].shape[0])
    with tempfile.TemporaryDirectory(prefix="fx-bench-ind-") as tmp:
        d = Path(tmp)
        one = d / "one_instrument"  # for the agreement: TA-Lib knows no rolls
        one.mkdir()
        for k in ("open", "high", "low", "close", "inst"):
            np.save(d / f"{k}.npy", arrays[k])
            np.save(one / f"{k}.npy", np.zeros_like(arrays[k]) if k == "inst" else arrays[k])
        figures = time_sides(str(py), d, rounds, MALLOC_ENV)
        # the same with glibc's own (dynamic) thresholds in both servers: reported, no target
        default_malloc = time_sides(str(py), d, rounds, {})
        talib_side = Server(str(py), _TALIB_SIDE, d, "talib", MALLOC_ENV)
        versions = talib_side.versions
        talib_side.ask("save 1")
        talib_side.close()
        fx_one = Server(sys.executable, _FX_SIDE, one, "fx", MALLOC_ENV)
        fx_one.ask("save 1")
        fx_one.close()
        agree = agreement(d, one)
    for name, a in agree.items():
        figures[name]["agreement"] = a
    figures["default_malloc"] = {
        "what": "the same timings with glibc's default (dynamic) mmap and trim thresholds in both "
        "servers; no target",
        **{
            name: {
                k: f[k]
                for k in (
                    "fx_assets_wall_s",
                    "talib_wall_s",
                    "fx_assets_page_faults_per_call",
                    "talib_page_faults_per_call",
                    "ratio_of_medians",
                )
            }
            for name, f in default_malloc.items()
        },
    }
    targets = [
        target(
            f"{name}: fx_assets / TA-Lib wall time (ratio of medians)",
            figures[name]["ratio_of_medians"],
            "<=",
            1.0,
            "x",
            DESCRIPTIONS[name],
        )
        for name in DESCRIPTIONS
    ]
    targets += [
        target(
            f"{name}: max |delta| vs TA-Lib after burn-in",
            agree[name]["max_abs_delta_after_burn_in"],
            "<=",
            1e-9,
            "",
            "one instrument id (TA-Lib has no rolls)",
        )
        for name in agree
    ]
    rolls = int(np.count_nonzero(arrays["inst"][1:] != arrays["inst"][:-1]))
    return {
        "command": command_line(),
        "config": {
            "bars": source,
            "n_bars": n,
            "rolls_in_timed_bars": rolls,
            "rounds": rounds,
            "inner_calls_per_timing": INNER,
            "order": "per indicator: fx_assets then TA-Lib, alternating, each round",
            "processes": "each side a server process of the same shape (reads the arrays once, "
            "times calls on request), the same malloc settings in both",
            "malloc_env": MALLOC_ENV,
            "talib_env": str(TALIB_VENV),
            "talib_versions": versions,
            "threads": "both single-threaded (numba kernels are serial; TA-Lib is serial)",
        },
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "figures": figures,
        "targets": targets,
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    if args.rounds < 5:
        ap.error("--rounds must be >= 5")
    out = run(args.rounds)
    write_result("bench_indicators", out)
    for t in out["targets"]:
        print(f"{'PASS' if t['pass'] else 'FAIL'}  {t['name']}: {t['value']}")


if __name__ == "__main__":
    main(sys.argv[1:])
