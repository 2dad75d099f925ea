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
    out["peak_rss_mib"] = round(_status_kib("VmHWM") / 1024, 1)
    return out


def in_subprocess(module: str, *args: str) -> dict[str, Any]:
    """Run ``python -m module args`` (which prints one JSON object last) in a fresh process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "node": platform.node(),
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
