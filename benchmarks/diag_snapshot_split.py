"""Where the snapshot scan spends its CPU time, by feature group (issue 11).

The scan is one fused numba loop, so its groups cannot be timed from outside; instead each
group is *ablated*: a copy of ``core/snapshot_features.py`` with that group's computation
replaced by a constant (its outputs wrong on purpose, the rest unchanged) is compiled and
scanned over the same input as the full kernel, and the group's cost is the full kernel's CPU
time minus the ablated one's, per update. The compiler may drop more than the group (whatever
only fed it) or schedule the rest differently, so the split is an estimate: the parts need not
add up to the whole. With ``--baseline REF`` the same ablations of the module at git revision
REF run in the same rounds (A B A B ...), giving the split before and after.

Input, pinning and chunking are ``bench_snapshot``'s (the scale-1 quarter's 2.29 M
active-contract updates, chunks of 65,536 rows, CPU 0, ``NUMBA_NUM_THREADS=1``); the gather
into the chunk's matrices is outside the timed scan (``bench_snapshot`` reports it).

    python -m benchmarks.diag_snapshot_split [--baseline REF] [--rounds N] [--rows N] [--name NAME]

Prints one JSON object (also written to benchmarks/results/diag_snapshot_split.json, or NAME).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_snapshot as bs
from benchmarks.common import command_line, load_average, source_at, write_result

REPO = Path(__file__).resolve().parents[1]
MODULE = "fx_assets/core/snapshot_features.py"

# group -> (what it covers, replacements); each replacement is (alternatives, new): the first
# alternative found in the source is replaced (the kernel's text differs between revisions)
_Rep = tuple[tuple[str, ...], str]
GROUPS: dict[str, tuple[str, list[_Rep]]] = {
    "book_state": (
        "the 12 book-state columns: imbalances, weighted mid, slopes, distance imbalance, centre "
        "of mass, spread, count imbalance (_book_state_row; its level sums, where the OFI level "
        "loop takes them, stay)",
        [
            (
                (
                    "        _book_state_row(\n            bpx, apx, bsz, asz, bct, act, i, levels, tick, "
                    "inv_tick, slope, ints, jb, ja, midch, out\n        )\n",
                    "        _book_state_row(\n            bpx, apx, bsz, asz, i, levels, tick, inv_tick, "
                    "slope, ints, jb, ja, midch,\n            num5, den5, numl, denl, ctn, ctd, sb, sa, "
                    "db, da, com, out,\n        )  # fmt: skip\n",
                ),
                "",
            )
        ],
    ),
    "slopes": (
        "the two Næs–Skjeltorp book slopes (resumed at the first changed level)",
        [
            (
                (
                    "    bsl, nb = _slope_resume(bpx, bsz, i, levels, mid, tick, inv_tick, slope, 0, jb, "
                    "midch, ints[_I_SLOPE_NB])\n    asl, na = _slope_resume(apx, asz, i, levels, mid, "
                    "tick, inv_tick, slope, 1, ja, midch, ints[_I_SLOPE_NA])\n",
                    "    bsl, nb, asl, na = _slopes_resume(\n        bpx, apx, bsz, asz, i, levels, mid, "
                    "tick, inv_tick, slope, jb, ja, midch, nvb, nva\n    )\n",
                ),
                "    bsl, nb, asl, na = 0.5, 3, 0.25, 3\n",
            )
        ],
    ),
    "trades": (
        "trade windows, VPIN and Kyle's λ (updated on trade rows, repeated between)",
        [(("        if action[i] == TRADE:\n",), "        if action[i] == TRADE and n < 0:\n")],
    ),
    "clock_logs": (
        "the four clock log1p calls (since update / trade / mid change, event rate)",
        [
            (("out[i, o] = _log1p_us(ts[i] - ints[_I_LAST_TS])",), "out[i, o] = 0.0"),
            (("out[i, o + 1] = _log1p_us(ts[i] - ints[_I_LAST_TRADE_TS])",), "out[i, o + 1] = 0.0"),
            (("out[i, o + 2] = _log1p_us(ts[i] - ints[_I_LAST_MID_TS])",), "out[i, o + 2] = 0.0"),
            (
                ("out[i, o + 3] = math.log1p((cnt_r - 1) * 1e9 / span) if span > 0 else 0.0",),
                "out[i, o + 3] = 0.0",
            ),
        ],
    ),
    "flow_outputs": (
        "the flow-window output divisions (OFI, aggregated OFI, per-level OFI over mean depth)",
        [
            (("out[i, o] = sums[w] / md if md > 0 else 0.0",), "out[i, o] = 0.0"),
            (
                ("out[i, o_ag + nag * w + g] = sums[j] * (cnt_w * 2.0 * agg_lv[g]) / dq if dq > 0 else 0.0",),
                "out[i, o_ag + nag * w + g] = 0.0",
            ),
            (("out[i, o + m] = sums[s_ml + m] / md",), "out[i, o + m] = 0.0"),
        ],
    ),
    "rows_log": (
        "log_rows_since_break (table lookup below 16384 rows, libm above)",
        [(("out[i, o] = _log1p_nb(rows)",), "out[i, o] = 0.0")],
    ),
}


def _source(ref: str | None) -> tuple[str, str]:
    """(source of the scan module at ``ref`` or in this tree, label)."""
    if ref is None:
        return (REPO / MODULE).read_text(), "this tree"
    commit, (src,) = source_at(ref, [MODULE])
    return src, commit


def _ablate(src: str, reps: list[_Rep]) -> str:
    for alts, new in reps:
        hit = next((a for a in alts if a in src), None)
        if hit is None:
            raise ValueError(f"diag_snapshot_split: none of {alts!r} is in the source")
        src = src.replace(hit, new)
    return src


def _load(src: str, name: str, tmp: Path) -> Any:
    path = tmp / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run(baseline: str | None, rounds: int, rows: int | None) -> dict[str, Any]:
    os.sched_setaffinity(0, {0})
    import fx_assets.core.book as book

    inp = bs.Input(rows)
    n = len(inp)
    tmp = Path(tempfile.mkdtemp(prefix="diag_snapshot_split_"))
    versions = {"current": _source(None)}
    if baseline:
        versions["baseline"] = _source(baseline)
    mods: dict[tuple[str, str], Any] = {}
    for ver, (src, _) in versions.items():
        mods[(ver, "full")] = _load(src, f"_split_{ver}_full", tmp)
        for g, (_, reps) in GROUPS.items():
            mods[(ver, g)] = _load(_ablate(src, reps), f"_split_{ver}_{g}", tmp)
    bs._BASELINE["book"] = book  # one_pass(impl="baseline") gathers with this tree's gather
    cpu: dict[tuple[str, str], list[float]] = {k: [] for k in mods}
    for r in range(rounds + 1):  # round 0 compiles and warms, untimed
        for key, mod in mods.items():
            bs._BASELINE["scan"] = mod
            figs = bs.one_pass(inp, bs.SPEED_CHUNK, "baseline")
            if r:
                cpu[key].append(figs["scan_cpu_s"])
    out: dict[str, Any] = {
        "rows": n,
        "chunk_rows": bs.SPEED_CHUNK,
        "rounds": rounds,
        "groups": {g: d for g, (d, _) in GROUPS.items()},
    }
    for ver, (_, label) in versions.items():
        full = float(np.median(cpu[(ver, "full")]))
        split: dict[str, Any] = {
            "source": label,
            "full_ns_per_update": round(full / n * 1e9, 1),
            "full_updates_per_cpu_s": round(n / full),
            "full_cpu_s_rounds": [round(x, 4) for x in cpu[(ver, "full")]],
        }
        for g in GROUPS:
            med = float(np.median(cpu[(ver, g)]))
            split[g] = {
                "ns_per_update": round((full - med) / n * 1e9, 1),
                "share_of_scan": round((full - med) / full, 3),
                "ablated_cpu_s_rounds": [round(x, 4) for x in cpu[(ver, g)]],
            }
        out[ver] = split
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--baseline", default=None, metavar="REF")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=0, help="first N active rows only (0: all)")
    ap.add_argument("--name", default="diag_snapshot_split")
    a = ap.parse_args(argv)
    before = load_average()
    res = run(a.baseline, a.rounds, a.rows or None)
    payload = {"command": command_line(), "load_average_before": before, "figures": res}
    write_result(a.name, payload)
    print(json.dumps(payload, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
