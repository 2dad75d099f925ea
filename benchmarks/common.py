"""Benchmark plumbing: run a measurement in a fresh process, record peak memory and write results.

Peak memory is reported two ways: ``peak_rss_mib`` (the kernel's high-water mark VmHWM, which
also counts file pages the process mapped, e.g. a memory-mapped sidecar being written or read)
and ``peak_anon_mib`` (private memory only, sampled every 5 ms), which is what a chunked decoder
must keep bounded.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DATA = ROOT / "data"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class MemorySampler:
    """Samples RssAnon in a background thread; ``peak_anon_mib`` after ``stop()``."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, _status_kib("RssAnon"))
            time.sleep(self.interval)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, _status_kib("RssAnon"))

    @property
    def peak_anon_mib(self) -> float:
        return self.peak_kib / 1024


def measure(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in this process; add wall seconds and memory peaks to what it returns."""
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    out.setdefault("seconds", seconds)
    out["peak_anon_mib"] = round(mem.peak_anon_mib, 1)
    out["rss_file_mib_at_end"] = round(_status_kib("RssFile") / 1024, 1)
    out["peak_rss_mib"] = round(_status_kib("VmHWM") / 1024, 1)
    return out


def in_subprocess(module: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module args`` (which prints one JSON object last) in a fresh process;
    ``env`` adds to / overrides the environment. The child's stderr is passed through."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mem_total_gib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def machine() -> dict[str, Any]:
    import numba
    import numpy
    import pyarrow

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "node": platform.node(),
        "mem_total_gib": _mem_total_gib(),
        "load_average_at_write": load_average(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "pyarrow": pyarrow.__version__,
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


# ----------------------------------------------------------------------------------------------
# benchmark data: synthetic markets generated once, reused while their config is unchanged


def _quarter(label: str) -> Any:
    from fx_assets.core.calendar import parse_quarter

    return parse_quarter(label)


def market_config(quarters: list[str], scale: float, book_ratio: float, seed: int = 0) -> dict[str, Any]:
    """The JSON-able config of a benchmark market (what its manifest is checked against)."""
    return {
        "symbols": ["ES.FUT"],
        "quarters": quarters,
        "scale": scale,
        "seed": seed,
        "signal": 0.0,
        "book_ratio": book_ratio,
    }


def raw_file(root: Path, schema: str, quarter: str, symbol: str = "ES.FUT") -> Path:
    """Where ``fx_assets.core.synth`` writes a (schema, quarter) DBN file under ``root``."""
    return root / "raw" / schema / symbol / f"{symbol}_{quarter}.dbn.zst"


def ensure_market(name: str, config: dict[str, Any]) -> Path:
    """``DATA/name``: the synthetic market of ``config``, generated unless a manifest says that
    exactly this config is already there (with every file at its recorded size)."""
    from fx_assets.core.synth import SynthConfig, generate_market

    root = DATA / name
    manifest = root / "bench_manifest.json"
    if manifest.is_file():
        old = json.loads(manifest.read_text())
        files_ok = all(Path(p).is_file() and Path(p).stat().st_size == s for p, s in old["files"].items())
        if old.get("config") == config and files_ok:
            return root
    manifest.unlink(missing_ok=True)
    cfg = SynthConfig(
        quarters=tuple(_quarter(q) for q in config["quarters"]),
        symbols=tuple(config["symbols"]),
        scale=float(config["scale"]),
        seed=int(config["seed"]),
        signal=float(config["signal"]),
        book_ratio=float(config["book_ratio"]),
    )
    print(f"[data] generating {name}: {config}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    report = generate_market(root, cfg)
    files = {
        str(raw_file(root, schema, q)): raw_file(root, schema, q).stat().st_size
        for q in config["quarters"]
        for schema in ("trades", "mbp-10")
    }
    manifest.write_text(
        json.dumps({"config": config, "files": files, "report": report.to_dict()}, indent=2, default=str)
    )
    print(f"[data] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return root


def free_disk_gb(path: Path) -> float:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 1e9


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# The benchmark markets (ES.FUT, seed 0, no planted signal). Quarters are independent in the
# generator (byte-identical whichever quarters are generated together), so the 1- and
# 3-quarter data roots are views (symlinks) of the last quarters of the 9-quarter one.
QUARTERS_9 = [f"{y}-Q{q}" for y in (2022, 2023) for q in (1, 2, 3, 4)] + ["2024-Q1"]
MAIN_MARKET = ("es_s1_9q", market_config(QUARTERS_9, scale=1.0, book_ratio=0.1))
HEAVY_MARKET = ("es_s1_book2.5", market_config(["2024-Q1"], scale=1.0, book_ratio=2.5))
TINY_MARKET = ("es_tiny_2q", market_config(["2023-Q4", "2024-Q1"], scale=0.01, book_ratio=0.1))
LAST_QUARTER = "2024-Q1"


def target(
    name: str, value: float | None, op: str, bound: float, unit: str, note: str = ""
) -> dict[str, Any]:
    """One target and whether ``value`` meets it (``op`` is ``<``, ``<=``, ``>`` or ``>=``);
    a missing value (skipped measurement) is neither pass nor fail."""
    ok: bool | None
    if value is None:
        ok = None
    else:
        ok = {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[op]
    return {"name": name, "value": value, "target": f"{op} {bound} {unit}".strip(), "pass": ok, "note": note}


def command_line() -> str:
    """The command this process was started with (``python -m benchmarks.run_all`` ...)."""
    return " ".join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
