"""Regenerate the figures of ``benchmarks/README.md`` (and the excerpt in the main README) from the
result files in ``benchmarks/results/`` only, so that no figure there is typed by hand.

``python -m benchmarks.report`` (also the last step of ``make bench`` / ``make bench-quick``).
A README holds generated sections between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED -->``; everything between the two markers is replaced by the section
``name`` rendered from the result files, everything outside them is left alone. Known files get
their own tables (``bench_peers``); every other result file is rendered generically (its
targets with value, bound and pass/fail, or its top-level figures when it has no targets), so a
new benchmark module shows up without a change here; any ``{"stages": {stage: seconds}}`` under a
file's ``figures`` adds a per-stage table and a stacked bar picture. A section whose result file
is missing says "not run". Plots (PNG, matplotlib: the optional ``bench`` extra) go to
``benchmarks/plots/``; the
README text does not depend on whether they could be drawn, so the up-to-date check
(``fx_assets_tests/test_bench_report.py``) runs without matplotlib.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
PLOTS = ROOT / "plots"
BENCH_README = ROOT / "README.md"
MAIN_README = ROOT.parent / "README.md"

BEGIN = re.compile(r"<!-- BEGIN GENERATED: ([A-Za-z0-9_.:-]+) -->")
END = "<!-- END GENERATED -->"

Results = dict[str, dict[str, Any]]


# --- loading and formatting -------------------------------------------------------------------


def load_results(results_dir: Path = RESULTS) -> Results:
    """Every ``*.json`` in ``results_dir`` by file stem; a file that is not valid JSON is kept as
    ``{"_error": ...}`` so the report says so instead of failing."""
    out: Results = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            data = {"_error": f"unreadable: {exc}"}
        out[path.stem] = data if isinstance(data, dict) else {"_error": "not a JSON object"}
    return out


def fmt(v: Any) -> str:
    """A figure as text: 4 significant digits, thousands separators for large numbers."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, dict) and "median" in v:
        return fmt_rounds(v)
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def fmt_rounds(r: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
    """``{min, median, max, rounds}`` as "median (min–max, n rounds)"."""
    med, lo, hi = (r.get(k) for k in ("median", "min", "max"))
    if not (isinstance(med, (int, float)) and isinstance(lo, (int, float)) and isinstance(hi, (int, float))):
        return fmt(med)
    u = f" {unit}" if unit else ""
    return f"{fmt(med * scale)}{u} ({fmt(lo * scale)}–{fmt(hi * scale)}, {r.get('rounds', '?')} rounds)"


def table(header: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def targets_of(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Targets in either shape used by the result files: a list of ``common.target`` dicts, or a
    mapping name -> {value, target, pass}."""
    t = res.get("targets")
    if isinstance(t, list):
        return [x for x in t if isinstance(x, dict)]
    if isinstance(t, dict):
        return [{"name": k, **v} for k, v in t.items() if isinstance(v, dict)]
    return []


def verdict(t: dict[str, Any]) -> str:
    p = t.get("pass")
    return "skip" if p is None else ("**pass**" if p else "**FAIL**")


def _load(res: dict[str, Any]) -> str:
    before = res.get("load_average_before", res.get("load_avg_before"))
    after = res.get("load_average_after", res.get("load_avg_after"))
    if before is None and after is None:
        return "–"
    return f"{fmt(before[0] if isinstance(before, list) else before)} → {fmt(after[0] if isinstance(after, list) else after)}"


def _machine(res: dict[str, Any]) -> str:
    m = res.get("machine")
    if not isinstance(m, dict):
        return "–"
    cpu = m.get("cpu_model") or m.get("gpu") or m.get("machine") or "?"
    cores = m.get("cores_usable", m.get("cpus"))
    mem = m.get("mem_total_gib")
    parts = [str(cpu)]
    if cores is not None:
        parts.append(f"{cores} cores")
    if mem is not None:
        parts.append(f"{fmt(mem)} GiB")
    return ", ".join(parts)


def _commit(res: dict[str, Any]) -> str:
    v = res.get("versions")
    c = v.get("fx_assets_commit") if isinstance(v, dict) else res.get("commit")
    return f"`{c[:10]}{'+dirty' if c.endswith('+dirty') else ''}`" if isinstance(c, str) else "–"


def provenance(name: str, res: dict[str, Any]) -> str:
    """One line: where the figures come from (file, when, command, machine, load, commit)."""
    cmd = res.get("command")
    bits = [f"`results/{name}.json`"]
    if res.get("mode"):
        bits.append(f"mode {res['mode']}")
    bits.append(f"written {res.get('when', '?')}")
    bits.append(f"machine: {_machine(res)}")
    bits.append(f"load (1 min) {_load(res)}")
    bits.append(f"commit {_commit(res)}")
    line = "; ".join(bits) + "."
    if isinstance(cmd, str) and cmd:
        line += f" Command: `{cmd}`."
    return line


def _scalars(
    d: Any, prefix: str = "", out: list[tuple[str, Any]] | None = None, depth: int = 0
) -> list[tuple[str, Any]]:
    out = [] if out is None else out
    if isinstance(d, dict):
        if "median" in d and "rounds" in d:
            out.append((prefix, d))
            return out
        for k, v in d.items():
            if depth < 3:
                _scalars(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        out.append((prefix, d))
    return out


GENERIC_MAX_ROWS = 16


def render_generic(name: str, res: dict[str, Any] | None) -> str:
    """Any result file: provenance, then its targets, or (without targets) its first figures."""
    if res is None:
        return f"`results/{name}.json`: not run."
    if "_error" in res:
        return f"`results/{name}.json`: {res['_error']}."
    lines = [provenance(name, res), ""]
    ts = targets_of(res)
    if ts:
        rows = [
            [str(t.get("name", "?")), fmt(t.get("value")), str(t.get("target", "")), verdict(t)] for t in ts
        ]
        lines.append(table(["target", "value", "bound", "result"], rows))
    else:
        figs = res.get("figures")
        src: dict[str, Any] = figs if isinstance(figs, dict) else res
        skip = {"machine", "versions", "config", "load_average_before", "load_average_after"}
        items = [
            (k, v)
            for k, v in _scalars({k: v for k, v in src.items() if k not in skip})
            if not k.startswith("when")
        ]
        if not items:
            lines.append("No targets and no numeric figures recorded.")
        else:
            shown = items[:GENERIC_MAX_ROWS]
            lines.append("No targets recorded; figures:")
            lines.append("")
            lines.append(table(["figure", "value"], [[f"`{k}`", fmt(v)] for k, v in shown]))
            if len(items) > len(shown):
                lines.append("")
                lines.append(f"… and {len(items) - len(shown)} more figures in the file.")
    stages = render_stages(name, res)
    if stages:
        lines += ["", stages]
    return "\n".join(lines)


# --- per-stage breakdowns (any result file) ---------------------------------------------------

STAGE_GROUPS_MAX = 6


def _seconds(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, dict) and isinstance(v.get("median"), (int, float)):
        return float(v["median"])
    return None


def stage_groups(res: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """Every ``{"stages": {stage: seconds}}`` under ``figures`` (depth <= 3), labelled by its path;
    a stage given as {min, median, max, rounds} counts with its median."""
    out: list[tuple[str, dict[str, float]]] = []

    def walk(d: Any, path: str, depth: int) -> None:
        if not isinstance(d, dict) or depth > 3:
            return
        st = d.get("stages")
        if isinstance(st, dict):
            vals = {str(k): _seconds(v) for k, v in st.items()}
            clean = {k: v for k, v in vals.items() if v is not None}
            if clean:
                out.append((path or "stages", clean))
        for k, v in d.items():
            if k != "stages":
                walk(v, f"{path}.{k}" if path else str(k), depth + 1)

    figs = res.get("figures")
    walk(figs if isinstance(figs, dict) else {}, "", 0)
    return out[:STAGE_GROUPS_MAX]


def render_stages(name: str, res: dict[str, Any]) -> str:
    groups = stage_groups(res)
    if not groups:
        return ""
    stages: list[str] = []
    for _, st in groups:
        stages += [k for k in st if k not in stages]
    rows = [[s] + [fmt(st.get(s)) for _, st in groups] for s in stages]
    rows.append(["**total**"] + [f"**{fmt(sum(st.values()))}**" for _, st in groups])
    return (
        "Per-stage seconds:\n\n"
        + table(["stage"] + [f"`{label}`" for label, _ in groups], rows)
        + f"\n\n![{name}: per-stage seconds](plots/{name}_stages.png)"
    )


def plot_stages(name: str, res: dict[str, Any], out_dir: Path) -> Path | None:
    """Stacked horizontal bars of the per-stage seconds. None without matplotlib or stages."""
    groups = stage_groups(res)
    if not groups:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    stages: list[str] = []
    for _, st in groups:
        stages += [k for k in st if k not in stages]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(groups) + 1.8))
    left = [0.0] * len(groups)
    cmap = plt.get_cmap("tab20")
    for i, s in enumerate(stages):
        vals = [st.get(s, 0.0) for _, st in groups]
        ax.barh(range(len(groups)), vals, left=left, color=cmap(i % 20), label=s)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(range(len(groups)), [label for label, _ in groups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (wall)")
    ax.set_title(f"{name}: per-stage seconds ({res.get('when', '')})", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}_stages.png"
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


# --- bench_peers ------------------------------------------------------------------------------


def _med(r: dict[str, Any], key: str = "wall_s") -> float | None:
    x = r.get(key, {})
    return x.get("median") if isinstance(x, dict) else None


def _ratio_row(
    what: str, fx: dict[str, Any], peer: dict[str, Any], agreement: str, peer_name: str
) -> list[str]:
    fw, pw = _med(fx), _med(peer)
    fc, pc = _med(fx, "cpu_s"), _med(peer, "cpu_s")
    ratio = f"**{pw / fw:.3g}×**" if fw and pw else "–"
    cpu_ratio = f"{pc / fc:.3g}×" if fc and pc else "–"
    return [
        what,
        fmt_rounds(fx["wall_s"], 1e3, "ms") if "wall_s" in fx else "–",
        f"{peer_name}: " + (fmt_rounds(peer["wall_s"], 1e3, "ms") if "wall_s" in peer else "–"),
        ratio,
        cpu_ratio,
        agreement,
    ]


def peer_rows(res: dict[str, Any]) -> list[list[str]]:
    f = res.get("figures", {})
    rows: list[list[str]] = []
    if "volume_bars" in f:
        v = f["volume_bars"]
        t, a = v["timings"], v["agreement"]
        diffs = max(val for k, val in a.items() if k.startswith("max_abs_diff"))
        agree = (
            f"{fmt(a['compared_bars'])} bars compared after bar 0: max abs diff of OHLCV {fmt(diffs)}; "
            f"close indices equal: {fmt(a['close_index_equal'])} ({fmt(a['n_bars_fx_assets'])} vs "
            f"{fmt(a['n_bars_finmlkit'])} bars)"
        )
        n = fmt(v["n_trades"])
        rows.append(
            _ratio_row(
                f"volume bars, {n} trades, V={v['volume_bar_contracts']}: user path",
                t["fx_assets"],
                t["finmlkit_api"],
                agree,
                "finmlkit `TradesData`+`VolumeBarKit.build_ohlcv`",
            )
        )
        rows.append(
            _ratio_row(
                "same, kernels only",
                t["fx_assets"],
                t["finmlkit_kernels"],
                "same bars",
                "finmlkit `_volume_bar_indexer`+`comp_bar_ohlcv`",
            )
        )
    for key, series in (("cusum", "trade prices"), ("cusum_bars", "volume-bar closes")):
        if key not in f:
            continue
        c = f[key]
        a = c["agreement"]
        agree = (
            f"events {fmt(a['events_fx_assets'])} vs {fmt(a['events_finmlkit'])}, "
            f"identical indices: {fmt(a['identical_event_indices'])}"
        )
        rows.append(
            _ratio_row(
                f"CUSUM filter on {fmt(c['n_prices'])} {series}, h={c['threshold_log']}",
                c["timings"]["fx_assets"],
                c["timings"]["finmlkit"],
                agree,
                "finmlkit `cusum_filter`",
            )
        )
    ib = f.get("imbalance_bars", {})
    for kind in ("tick", "volume"):
        if kind not in ib:
            continue
        k = ib[kind]
        a = k["agreement"]
        agree = (
            f"bars {fmt(a['bars_fx_assets'])} vs {fmt(a['bars_mlfinpy'])} (algorithms differ in details: "
            f"counts, not identity); whole quarter ({fmt(k['full_quarter_trades'])} trades): fx_assets "
            f"{fmt_rounds(k['fx_assets_full_quarter_wall_s'], 1e3, 'ms')}, mlfinpy extrapolated "
            f"{fmt(k['mlfinpy_full_quarter_extrapolated_s'])} s = {fmt(k['ratio_mlfinpy_extrapolated_over_fx_assets_full'])}×"
        )
        ts = k["timings_subset"]
        rows.append(
            _ratio_row(
                f"EMA {kind} imbalance bars, first {fmt(k['subset_trades'])} trades",
                ts["fx_assets"],
                ts["mlfinpy"],
                agree,
                f"mlfinpy `get_ema_{kind}_imbalance_bars`",
            )
        )
    if "decode" in f:
        d = f["decode"]
        t = d["timings"]
        agree = f"{fmt(d['n_records'])} records; count, Σsize, Σprice, first/last ts_recv identical: {fmt(d['agreement']['identical'])}"
        rows.append(
            _ratio_row(
                f"decode trades `.dbn.zst` ({fmt(d['compressed_bytes'] / 1e6)} MB)",
                t["fx_assets_build_sidecar"],
                t["databento_to_ndarray"],
                agree,
                "databento `DBNStore.to_ndarray`",
            )
        )
        fx, z = t["fx_assets_build_sidecar"], t["zstd"]
        row = _ratio_row("same, against plain zstd (the floor)", fx, z, "–", "zstd stream to nowhere")
        fw, zw = _med(fx), _med(z)
        row[3] = f"fx_assets / zstd = **{fw / zw:.3g}×**" if fw and zw else "–"
        row[4] = "–"
        rows.append(row)
    if "warm_load" in f:
        w = f["warm_load"]
        t = w["timings"]
        ok = fmt(w["agreement"]["sum_price_equal"])
        rows.append(
            _ratio_row(
                f"warm load, {w['n_columns']} trades columns (open + views)",
                t["fx_assets_sidecar_columns"],
                t["np_load_mmap"],
                "–",
                '`np.load(mmap_mode="r")` per column',
            )
        )
        rows.append(
            _ratio_row(
                "same, touching `price` (sum)",
                t["fx_assets_sidecar_columns_touch"],
                t["np_load_mmap_touch"],
                f"same sum: {ok}",
                '`np.load(mmap_mode="r")`',
            )
        )
    return rows


def render_peers(name: str, res: dict[str, Any] | None) -> str:
    if res is None:
        return f"`results/{name}.json`: not run."
    if "_error" in res:
        return f"`results/{name}.json`: {res['_error']}."
    cfg = res.get("config", {})
    peers = res.get("versions", {}).get("peers", {})
    lines = [
        provenance(name, res),
        "",
        f"Data: `{cfg.get('market', '?')}` {cfg.get('quarter', '')}: {fmt(cfg.get('active_trades'))} "
        f"active-contract trades of {fmt(cfg.get('source_trades'))}. Peers: "
        + ", ".join(f"{p} {v}" for p, v in peers.items())
        + ". Ratio = peer median / fx_assets median (> 1: fx_assets faster); CPU = user + sys of the "
        "process doing the work.",
        "",
        table(
            ["comparison", "fx_assets (wall)", "peer (wall)", "ratio (wall)", "ratio (CPU)", "agreement"],
            peer_rows(res),
        ),
    ]
    ib = res.get("figures", {}).get("imbalance_bars", {})
    if "extrapolation" in ib:
        lines += ["", f"Extrapolation: {ib['extrapolation']}."]
    ts = targets_of(res)
    if ts:
        lines += [
            "",
            table(
                ["target", "value", "bound", "result"],
                [[str(t["name"]), fmt(t.get("value")), str(t.get("target", "")), verdict(t)] for t in ts],
            ),
        ]
    plot = PLOTS / f"{name}.png"
    lines += ["", f"![{name}: peer time / fx_assets time](plots/{plot.name})"]
    return "\n".join(lines)


def plot_peers(name: str, res: dict[str, Any], out_dir: Path) -> Path | None:
    """Horizontal bars of peer / fx_assets (log scale). None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels, vals = [], []
    for row in peer_rows(res):
        m = re.fullmatch(r"\*\*([0-9.e+]+)×\*\*", row[3])  # peer / fx only (not fx / zstd)
        if m:
            labels.append(row[0] if len(row[0]) < 60 else row[0][:57] + "…")
            vals.append(float(m.group(1)))
    if not vals:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(vals) + 1.2))
    ax.barh(range(len(vals)), vals, color=["#2a7" if v >= 1 else "#c44" for v in vals])
    ax.set_yticks(range(len(vals)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("peer time / fx_assets time (wall, median; > 1 = fx_assets faster)")
    ax.set_title(f"{name} ({res.get('when', '')})", fontsize=9)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


# --- bench_scaleout -------------------------------------------------------------------------


def render_scaleout(name: str, res: dict[str, Any] | None) -> str:
    """The "When to move" table: one scale-1 quarter through Dagster, disk, Dask scaling, GPU."""
    if res is None:
        return f"`results/{name}.json`: not run."
    q, dk, g = res["scale1_quarter"], res.get("dask", {}), res.get("gpu_side") or {}
    rep = q["market_report"]
    rows = [
        [
            f"one `--scale {fmt(q['market']['scale'])}` quarter ({fmt(rep['n_trades'])} trades, "
            f"{fmt(rep['n_book_records'])} MBP-10 records) from `.dbn.zst` through one `build_features` run "
            f"(executor: {q.get('executor', '?')}; {fmt(q.get('materializations'))} stages and their checks, fresh process)",
            f"{fmt(q['run_seconds'])} s run, {fmt(q['process_wall_seconds'])} s process wall",
        ],
        [
            "disk per quarter and symbol at that scale",
            f"{fmt(q['raw_bytes'] / 1e9)} GB raw, {fmt(q['derived_bytes'] / 1e9)} GB derived",
        ],
    ]
    runs = dk.get("runs", {})
    nq = len(dk.get("market", {}).get("quarters", []))
    for w, r in sorted(runs.items(), key=lambda kv: int(kv[0])):
        rows.append(
            [
                f"feature backfill, {nq} quarters at scale {fmt(dk['market']['scale'])}, local Dask cluster, "
                f"{w} worker{'s' if int(w) > 1 else ''}",
                f"{fmt(r['backfill_seconds'])} s ({fmt(r['per_quarter_seconds'])} s per quarter)",
            ]
        )
    if "speedup_2_vs_1" in dk:
        rows.append(["2 workers against 1", f"{fmt(dk['speedup_2_vs_1'])}×"])
    if g:
        wf = g.get("walk_forward_3_folds_10_epochs_s", {})
        rows.append(
            [
                f"GPU side (copied from `{g.get('source', '?')}` when this file was written, "
                f"{str(res.get('when', '?'))[:10]}; later GPU runs are in that file, {g.get('gpu', '?')})",
                f"{fmt(g['fxcache_bytes_per_scale1_quarter'] / 1e9)} GB of fxcache per scale-1 quarter on the "
                f"device, loaded at {fmt(g['load_end_to_end_GBps'])} GB/s; fold transition "
                f"{fmt(g['fold_transition_ms'])} ms; 3 folds × 10 epochs: "
                + ", ".join(f"{k.upper()} {fmt(v)} s" for k, v in wf.items()),
            ]
        )
    return provenance(name, res) + "\n\n" + table(["what", "measured"], rows)


def render_gpu_dagster(name: str, res: dict[str, Any] | None) -> str:
    """``bench_gpu_dagster``: per train_models run, what its fold reports (quality after costs,
    the leak detector's AUC z against its block-permutation null, and the fold switch time the
    asset measures)."""
    if res is None:
        return f"`results/{name}.json`: not run."
    rows = []
    for run in res["train_runs"]:
        for f in run.get("folds", []):
            rows.append(
                [
                    str(f.get("trainer", run.get("trainer", "?"))),
                    str(run.get("seed", "?")),
                    str(f.get("fold", "?")),
                    fmt(f.get("auc")),
                    fmt(f.get("auc_null_z")),
                    fmt(f.get("gross_sharpe")),
                    fmt(f.get("net_sharpe")),
                    fmt(f.get("turnover")),
                    fmt(f.get("fold_transition_ms")),
                    fmt(f.get("kernel_warmup_ms")),
                ]
            )
    head = (
        f"{provenance(name, res)} Market: **{res.get('market', 'signal')}**, scale {res.get('scale')}, "
        f"quarters {res.get('quarters')}, {res.get('train_quarters')} training quarters, {res.get('gpu', '?')}."
    )
    return (
        head
        + "\n\n"
        + table(
            [
                "trainer",
                "seed",
                "fold",
                "AUC",
                "AUC null z",
                "gross Sharpe",
                "net Sharpe",
                "turnover",
                "fold switch ms (view + transition)",
                "kernel warm-up ms",
            ],
            rows,
        )
    )


# --- bench_snapshot --------------------------------------------------------------------------


def render_snapshot(name: str, res: dict[str, Any] | None) -> str:
    """``bench_snapshot``: updates/s per core of the scan beside its decode floor (and the previous
    kernel when compared A B A B), then peak memory by chunk size and input size."""
    if res is None:
        return f"`results/{name}.json`: not run."
    sp, mem = res["figures"]["speed"], res["figures"]["memory"]
    n = sp["rows"]
    lines = [
        provenance(name, res),
        "",
        f"{fmt(n)} active-contract MBP-10 updates ({fmt(sp['sidecar_records'])} sidecar records), chunks of "
        f"{fmt(sp['chunk_rows'])}, pinned to CPU {fmt(sp['pinned_cpus'])}; rounds alternate A B A B in one "
        "process; per core = per CPU second (getrusage), wall beside it.",
        "",
    ]
    rows = []
    label = {"current": "this commit", "reference": "previous kernel (test reference)"}
    if sp.get("baseline_commit"):
        ref, commit = sp["baseline_ref"], sp["baseline_commit"]
        named = f"`{commit[:7]}`" if commit.startswith(ref) else f"`{ref}` ({commit[:7]})"
        label["baseline"] = f"baseline {named}, outputs bit-identical"

    for impl in ("current", "baseline", "reference"):
        d = sp.get(impl)
        if not d:
            continue
        for part, what in (
            ("scan", "`snapshot_features` scan"),
            ("gather", "gather into the chunk's matrices"),
        ):
            rows.append(
                [
                    f"{what}, {label[impl]}",
                    fmt_rounds(d[f"{part}_updates_per_cpu_s"], 1e-6, "M/s"),
                    fmt_rounds(d[f"{part}_updates_per_wall_s"], 1e-6, "M/s"),
                    fmt_rounds(d[f"{part}_cpu_s"], 1.0, "s"),
                ]
            )
    fl = sp["read_floor"]
    rows.append(
        [
            "read floor: every sidecar value the scan reads, no conversion",
            fmt_rounds(fl["updates_per_cpu_s"], 1e-6, "M/s"),
            fmt_rounds(fl["updates_per_wall_s"], 1e-6, "M/s"),
            fmt_rounds(fl["cpu_s"], 1.0, "s"),
        ]
    )
    lines.append(table(["stage", "updates/s per core (CPU)", "updates/s (wall)", "CPU seconds"], rows))
    lines.append("")
    mrows = [
        [
            fmt(m["chunk_rows"]),
            f"{fmt(m['rows'])} ({m['passes']}×)",
            fmt(m["anon_mib_before_scan"]),
            fmt(m["peak_anon_mib"]),
            fmt(m["peak_rss_mib"]),
            fmt(m["scan_cpu_s"]),
        ]
        for m in mem.values()
    ]
    lines.append(
        table(
            [
                "chunk rows",
                "updates scanned",
                "private MiB before the scan",
                "peak private MiB",
                "peak RSS MiB (with mapped sidecar)",
                "scan CPU s",
            ],
            mrows,
        )
    )
    ts = targets_of(res)
    if ts:
        lines.append("")
        lines.append(
            table(
                ["target", "value", "bound", "result"],
                [
                    [str(t.get("name", "?")), fmt(t.get("value")), str(t.get("target", "")), verdict(t)]
                    for t in ts
                ],
            )
        )
    return "\n".join(lines)


def render_snapshot_split(name: str, res: dict[str, Any] | None) -> str:
    """``diag_snapshot_split``: the snapshot scan's CPU time by feature group (ablation), this
    tree beside its baseline when it has one."""
    if res is None:
        return f"`results/{name}.json`: not run."
    if "_error" in res:
        return f"`results/{name}.json`: {res['_error']}."
    f = res["figures"]
    vers = [v for v in ("baseline", "current") if isinstance(f.get(v), dict)]
    head = ["group (ablated)"] + [
        f"{'this tree' if v == 'current' else 'baseline `' + str(f[v]['source'])[:7] + '`'}: ns/update (share)"
        for v in vers
    ]
    rows = [
        ["whole scan"]
        + [f"{fmt(f[v]['full_ns_per_update'])} ({fmt(f[v]['full_updates_per_cpu_s'])}/s)" for v in vers]
    ]
    for g, what in f["groups"].items():
        rows.append(
            [f"`{g}`: {what}"]
            + [
                f"{fmt(f[v][g]['ns_per_update'])} ({fmt(round(100 * f[v][g]['share_of_scan']))} %)"
                for v in vers
            ]
        )
    return "\n".join(
        [
            provenance(name, res),
            "",
            f"{fmt(f['rows'])} updates, chunks of {fmt(f['chunk_rows'])}, CPU 0, median of {fmt(f['rounds'])} "
            "alternating rounds of CPU seconds; a group's figure is the whole scan minus the scan with that "
            "group replaced by a constant (an estimate: the parts need not add up).",
            "",
            table(head, rows),
        ]
    )


def render_load_path(name: str, res: dict[str, Any] | None) -> str:
    """``bench_load_path``: A (the checkout compared with) beside B (this one), per measure, wall
    and CPU seconds (medians over the rounds, min–max), what the definitions import loaded."""
    if res is None:
        return f"`results/{name}.json`: not run."
    figs = res.get("figures", {})
    a, b = figs.get("A", {}), figs.get("B", {})
    measures = [
        ("import", "wall_seconds", "`import fx_assets.definitions`, wall"),
        ("import", "cpu_seconds", "`import fx_assets.definitions`, CPU"),
        ("hit", "run_seconds", "full cache hit, execute_in_process: run duration"),
        ("hit", "wall_seconds", "full cache hit, execute_in_process: process wall"),
        ("hit", "cpu_seconds", "full cache hit, execute_in_process: process CPU"),
        ("cli_hit", "run_seconds", "full cache hit, `dagster asset materialize`: run duration"),
        ("cli_hit", "wall_seconds", "full cache hit, `dagster asset materialize`: process wall"),
        ("cli_hit", "cpu_seconds", "full cache hit, `dagster asset materialize`: CPU (with step processes)"),
        ("warm", "run_seconds", "warm rebuild, execute_in_process: run duration"),
        ("warm", "cpu_seconds", "warm rebuild, execute_in_process: process CPU"),
    ]
    rows = []
    for what, key, label in measures:
        ra, rb = a.get(what, {}).get(key), b.get(what, {}).get(key)
        if not ra and not rb:
            continue
        ma, mb = (r.get("median") if isinstance(r, dict) else None for r in (ra, rb))
        ratio = (
            round(mb / ma, 2)
            if isinstance(ma, (int, float)) and isinstance(mb, (int, float)) and ma
            else None
        )
        rows.append([label, fmt_rounds(ra or {}, unit="s"), fmt_rounds(rb or {}, unit="s"), fmt(ratio)])
    comp = res.get("compared", {})
    lines = [
        provenance(name, res),
        "",
        f"A: `{comp.get('A', '?')}`; B: `{comp.get('B', '?')}`; partition `{res.get('partition', '?')}`, "
        "rounds alternating A B A B.",
        "",
        table(["measure", "A", "B", "B / A (medians)"], rows),
        "",
        f"Heavy libraries loaded by the definitions import: A {fmt(a.get('loaded_by_definitions'))}; "
        f"B {fmt(b.get('loaded_by_definitions'))}.",
    ]
    ts = targets_of(res)
    if ts:
        lines += [
            "",
            table(
                ["target", "value", "bound", "result"],
                [
                    [str(t.get("name", "?")), fmt(t.get("value")), str(t.get("target", "")), verdict(t)]
                    for t in ts
                ],
            ),
        ]
    return "\n".join(lines)


def render_hit_floor(name: str, res: dict[str, Any] | None) -> str:
    """``diag_dagster_hit_floor``: run duration of the 7 stages' cache hit in each step shape with
    bodies that do nothing (Dagster's floor), one check run alone, and the CPU split of a real hit."""
    if res is None:
        return f"`results/{name}.json`: not run."
    fl = res["floor"]
    what = {
        "14_steps": "7 `@asset` + 7 `@asset_check` (today: 14 steps)",
        "7_steps": "checks in each asset's `check_specs` (7 steps)",
        "1_step": "one `@multi_asset(can_subset=True)` with 7 specs and 7 check specs (1 step)",
    }
    rows = [
        [
            what.get(shape, shape),
            fmt_rounds(f["run_seconds"], 1.0, "s"),
            fmt_rounds(f["cpu_seconds"], 1.0, "s"),
            fmt(f["events"]["median"]),
            fmt(f["seconds_per_event_in_run"]),
        ]
        for shape, f in fl["figures"].items()
    ]
    alone = fl["one_check_alone_1_step"]
    lines = [
        provenance(name, res),
        "",
        table(["shape (bodies do nothing)", "run duration", "CPU", "events", "run s / event in run"], rows),
        "",
        f"One check of the 1-step shape run alone: {fmt(alone['steps'])} step, "
        f"{fmt(alone['materializations'])} materializations, {fmt(alone['check_evaluations'])} check "
        f"evaluation, run {fmt(alone['run_seconds'])} s, {fmt(alone['events'])} events.",
    ]
    prof = res.get("profile")
    if prof:
        cpu = prof["cpu_seconds_profiled"]
        share = prof["cpu_share"]
        lines += [
            "",
            f"A real full hit of `build_features` ({prof['partition']}) under cProfile (CPU timer): "
            f"{fmt(prof['execute_in_process']['cpu_seconds'])} s CPU in `execute_in_process`, run "
            f"{fmt(prof['split'].get('asset_steps_seconds'))} s in asset steps, "
            f"{fmt(prof['split'].get('check_steps_seconds'))} s in check steps, "
            f"{fmt(prof['split'].get('events'))} events.",
            "",
            table(
                [
                    "where (cumulative; event storage includes the events of create_run and resource init)",
                    "CPU s (profiled)",
                    "share",
                ],
                [[k, fmt(v), fmt(share[k])] for k, v in cpu.items()],
            ),
        ]
    return "\n".join(lines)


# --- sections ---------------------------------------------------------------------------------

# Result files with their own section in benchmarks/README.md (renderer; None = generic). Every
# other result file is rendered in the section "other".
KNOWN: dict[str, Callable[[str, dict[str, Any] | None], str] | None] = {
    "bench_peers": render_peers,
    "bench_peers_quick": render_peers,
    "bench_indicators": None,
    "bench_decode": None,
    "bench_features": None,
    "bench_integrity": None,
    "bench_integrity_quick": None,
    "scaleout": render_scaleout,
    "bench_dagster_path": None,
    "bench_dagster_path_hit": None,
    "bench_dagster_path_hit_nochecks": None,
    "diag_dagster_hit_floor": render_hit_floor,
    "bench_load_path": render_load_path,
    "bench_load_path_hitpath": render_load_path,
    "bench_hit_storage": None,
    "bench_scaling": None,
    "bench_features_scaling": None,
    "bench_snapshot": render_snapshot,
    "bench_snapshot_quick": render_snapshot,
    "diag_snapshot_split": render_snapshot_split,
    "gpu_h200": None,
    "gpu_h200_asset_path": None,
    "gpu_h200_kernels": None,
    "gpu_h200_dagster_signal": render_gpu_dagster,
    "gpu_h200_dagster_null": render_gpu_dagster,
}


def render_summary(results: Results) -> str:
    """Every result file: when, machine, load, commit, targets passed / failed / skipped."""
    if not results:
        return "No result files yet: run `make bench-quick` or `make bench`."
    rows = []
    for name, res in results.items():
        ts = targets_of(res)
        p = sum(1 for t in ts if t.get("pass") is True)
        f = sum(1 for t in ts if t.get("pass") is False)
        s = sum(1 for t in ts if t.get("pass") is None)
        rows.append(
            [
                f"`{name}.json`",
                str(res.get("mode", "–")),
                str(res.get("when", "–")),
                _machine(res),
                _load(res),
                _commit(res),
                f"{p} / {f} / {s}" if ts else "no targets",
            ]
        )
    return table(
        [
            "result",
            "mode",
            "written (UTC)",
            "machine",
            "load before → after",
            "commit",
            "targets pass / fail / skip",
        ],
        rows,
    )


def render_other(results: Results) -> str:
    others = [n for n in results if n not in KNOWN]
    if not others:
        return "No other result files."
    return "\n\n".join(f"#### {n}\n\n{render_generic(n, results[n])}" for n in others)


def render_headline(results: Results) -> str:
    """The excerpt in the main README: the peer ratios and where every target stands."""
    lines = []
    peers = results.get("bench_peers") or results.get("bench_peers_quick")
    name = "bench_peers" if "bench_peers" in results else "bench_peers_quick"
    if peers and "_error" not in peers:
        lines.append(
            f"Against the libraries users would otherwise pick (`benchmarks/results/{name}.json`, {peers.get('when', '?')}, {_machine(peers)}):"
        )
        lines.append("")
        rows = [[r[0], r[3], r[5]] for r in peer_rows(peers)]
        lines.append(table(["comparison", "peer time / fx_assets time", "agreement"], rows))
    else:
        lines.append("Peer comparison (`bench_peers`): not run.")
    lines.append("")
    lines.append("Targets of every result file (details: [benchmarks/README.md](benchmarks/README.md)):")
    lines.append("")
    lines.append(render_summary(results))
    # Quick runs are smoke tests on a small market: their misses are in benchmarks/README.md.
    missed = [
        [f"`{n}`", str(t.get("name", "?")), fmt(t.get("value")), str(t.get("target", ""))]
        for n, res in results.items()
        if res.get("mode") != "quick"
        for t in targets_of(res)
        if t.get("pass") is False
    ]
    lines.append("")
    if missed:
        lines.append("Targets missed in the latest full results:")
        lines.append("")
        lines.append(table(["result", "target", "value", "bound"], missed))
    else:
        lines.append("No target missed in the latest results.")
    return "\n".join(lines)


def section(name: str, results: Results) -> str:
    if name == "summary":
        return render_summary(results)
    if name == "other":
        return render_other(results)
    if name == "headline":
        return render_headline(results)
    if name.startswith("result:"):
        stem = name.split(":", 1)[1]
        renderer = KNOWN.get(stem) or render_generic
        try:
            return renderer(stem, results.get(stem))
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
            # A result file whose shape changed: still every figure, just not the nicer table.
            generic = render_generic(stem, results.get(stem))
            return f"(shape not recognised by the {renderer.__name__} table: {type(exc).__name__} {exc}; generic view)\n\n{generic}"
    raise KeyError(f"unknown generated section {name!r}")


def regenerate(text: str, results: Results) -> str:
    """``text`` with every generated section replaced; raises on an unclosed marker."""
    out: list[str] = []
    pos = 0
    while m := BEGIN.search(text, pos):
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"generated section {m.group(1)!r} has no {END}")
        out.append(text[pos : m.end()])
        out.append("\n" + section(m.group(1), results).strip() + "\n")
        out.append(END)
        pos = end + len(END)
    out.append(text[pos:])
    return "".join(out)


def write_plots(results: Results, out_dir: Path = PLOTS) -> list[Path]:
    made = []
    for name, res in results.items():
        if "_error" in res:
            continue
        try:
            plots = [plot_stages(name, res, out_dir)]
            if KNOWN.get(name) is render_peers:
                plots.append(plot_peers(name, res, out_dir))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            print(f"plot of {name} skipped: {type(exc).__name__} {exc}", file=sys.stderr)
            continue
        made += [p for p in plots if p is not None]
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the benchmark tables from the result files.")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--readme", type=Path, action="append", help="README(s) to regenerate (default: both)")
    ap.add_argument("--plots", type=Path, default=PLOTS)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if a README is not up to date; write nothing"
    )
    args = ap.parse_args(argv)
    results = load_results(args.results)
    stale = []
    for readme in args.readme or [BENCH_README, MAIN_README]:
        old = readme.read_text()
        new = regenerate(old, results)
        if new != old:
            stale.append(readme)
            if not args.check:
                readme.write_text(new)
    if args.check:
        for r in stale:
            print(
                f"{r}: not up to date with the result files (run python -m benchmarks.report)",
                file=sys.stderr,
            )
        return 1 if stale else 0
    if not args.no_plots:
        for p in write_plots(results, args.plots):
            print(f"plot: {p}")
    for r in stale:
        print(f"regenerated: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
