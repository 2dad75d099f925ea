"""Benchmark plumbing: run a measurement in a fresh process, record peak memory and write results.

Peak memory is reported two ways: ``peak_rss_mib`` (the kernel's high-water mark VmHWM, which
also counts file pages the process mapped, e.g. a memory-mapped sidecar being written or read)
and ``peak_anon_mib`` (private memory only, sampled every 5 ms), which is what a chunked decoder
must keep bounded.

Every result file gets ``machine`` (CPU model, cores, memory), ``versions`` (python, numpy,
numba, pyarrow, the fx_assets git commit, plus whatever peers a benchmark adds) and the load
average before (when this module was imported, unless the benchmark records its own) and after
(when the file is written). Timings over repeated rounds are summarised by ``rounds_summary``
as {min, median, max, rounds}; ``alternate`` runs competing callables A B A B in one process.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
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


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (``platform.processor()`` is often empty)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    import numba
    import numpy
    import pyarrow

    return {
        "cpu_model": cpu_model(),
        "cores_usable": len(os.sched_getaffinity(0)),
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


def source_at(ref: str, paths: list[str]) -> tuple[str, list[str]]:
    """(the commit ``ref`` names, the text of each repository path at that commit): what the
    same-process A/B benchmarks import as their baseline."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    texts = [
        subprocess.run(
            ["git", "show", f"{commit}:{rel}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        for rel in paths
    ]
    return commit, texts


def git_commit() -> str:
    """The fx_assets commit the benchmark ran on (``+dirty`` when tracked code differs)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        # Result files and the READMEs generated from them do not make the code dirty.
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!benchmarks/results",
                ":!benchmarks/plots",
                ":!benchmarks/README.md",
                ":!README.md",
            ],
            cwd=ROOT.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def versions(peers: dict[str, str] | None = None) -> dict[str, Any]:
    """Versions that explain a figure: interpreter, array stack, the fx_assets commit and, under
    ``peers``, the peer libraries a benchmark compared against (name -> version)."""
    import numba
    import numpy
    import pyarrow

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "pyarrow": pyarrow.__version__,
        "fx_assets_commit": git_commit(),
        "peers": dict(peers or {}),
    }


# The load average when the benchmark process started (a fallback "before" for benchmarks that
# do not record their own).
LOAD_AT_IMPORT = os.getloadavg()


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``results/<name>.json``: ``payload`` plus benchmark name, time, machine, versions
    and load average before/after (each kept if ``payload`` already has it)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **payload,
    }
    payload.setdefault("versions", versions())
    payload.setdefault("load_average_before", [round(x, 2) for x in LOAD_AT_IMPORT])
    payload.setdefault("load_average_after", load_average())
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
# The market of `make bench-quick` (~1 M trades; generated in a few seconds, then reused).
QUICK_MARKET = ("es_quick_1q", market_config(["2024-Q1"], scale=0.05, book_ratio=0.1))
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


# ----------------------------------------------------------------------------------------------
# repeated rounds


def rounds_summary(samples: list[float] | tuple[float, ...], digits: int = 6) -> dict[str, Any]:
    """{min, median, max, rounds} of repeated measurements (seconds or any timing figure)."""
    vals = [float(x) for x in samples]
    if not vals:
        raise ValueError("rounds_summary needs at least one sample")
    return {
        "min": round(min(vals), digits),
        "median": round(statistics.median(vals), digits),
        "max": round(max(vals), digits),
        "rounds": len(vals),
    }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def timed(fn: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    """Call ``fn`` once: ({wall_s, cpu_s}, its return value)."""
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": cpu_seconds() - c0}, out


def alternate(
    fns: dict[str, Callable[[], dict[str, float]]], rounds: int, warmup: int = 1
) -> dict[str, dict[str, dict[str, Any]]]:
    """Run competing measurements A B A B ... in one process so that drifting machine load hits
    each alike. Each callable does one round and returns its figures ({"wall_s": .., "cpu_s":
    ..}, any names); ``warmup`` untimed rounds each first (numba compiles, page cache). Returns
    name -> figure -> ``rounds_summary``."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for key, val in fn().items():
                samples[name].setdefault(key, []).append(val)
    return {name: {k: rounds_summary(v) for k, v in figs.items()} for name, figs in samples.items()}
