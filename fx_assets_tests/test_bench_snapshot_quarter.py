"""The step readings of benchmarks/bench_snapshot_quarter: CPU and memory between two events."""

from __future__ import annotations

import pytest

from benchmarks.bench_snapshot_quarter import CpuTrace


def _trace() -> CpuTrace:
    tr = CpuTrace()
    # (wall time, CPU seconds, RssAnon KiB)
    tr.samples = [(10.0, 1.0, 1024), (10.5, 1.4, 4096), (11.0, 2.0, 2048), (11.5, 2.1, 8192)]
    return tr


def test_values_at_a_time_are_the_last_sample_at_or_before_it() -> None:
    tr = _trace()
    assert tr.cpu_at(10.0) == 1.0
    assert tr.cpu_at(10.9) == 1.4
    assert tr.cpu_at(99.0) == 2.1
    assert tr.cpu_at(9.0) == 1.0  # before the first sample: the first
    assert tr.anon_mib_at(11.2) == 2.0


def test_peak_is_taken_inside_the_window_only() -> None:
    tr = _trace()
    assert tr.peak_anon_mib(10.0, 11.0) == 4.0
    assert tr.peak_anon_mib(11.0, 11.4) == 2.0
    assert tr.peak_anon_mib(12.0, 13.0) == 0.0


def test_a_live_trace_sees_this_process_work() -> None:
    with CpuTrace(interval=0.005) as tr:
        x = 0
        for i in range(2_000_000):
            x += i
    t0, t1 = tr.samples[0][0], tr.samples[-1][0]
    assert tr.cpu_at(t1) - tr.cpu_at(t0) > 0
    assert tr.peak_anon_mib(t0, t1) > 0
    assert x == pytest.approx(1999999000000)
