"""The ``fx-assets`` command: ``synth`` (write a synthetic market), ``inspect`` (look into a DBN
file, a sidecar or an fxcache) and ``demo`` (synthesise a small market and materialize every
asset into the project's Dagster instance).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


class _LazyConsole:
    """rich's stderr Console, imported on first use: ``fx-assets decode`` without a terminal
    never loads rich (process start and imports count in a command this short)."""

    _console: Console | None = None

    def get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            type(self)._console = Console(stderr=True)
        assert self._console is not None
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


console: Any = _LazyConsole()


def _real_console() -> Console:
    """The Console itself (rich's Live needs it, not the proxy; tests may replace ``console``)."""
    return console.get() if isinstance(console, _LazyConsole) else console


DEMO_SCALE = 0.01
DEMO_SIGNAL = 1.0
DEMO_SEED = 7


def _progress() -> Progress:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=_real_console(),
        transient=False,
    )


def _progress_callback(progress: Progress) -> Callable[[str, int, int], None]:
    tasks: dict[str, Any] = {}

    def cb(label: str, done: int, total: int) -> None:
        if label not in tasks:
            tasks[label] = progress.add_task(label, total=max(total, 1))
        progress.update(tasks[label], completed=done, total=max(total, 1))

    return cb


# --- synth ----------------------------------------------------------------------------------


def cmd_synth(args: argparse.Namespace) -> int:
    from fx_assets.core.calendar import quarter_range
    from fx_assets.core.synth import SynthConfig, generate_market

    symbols = tuple(s.strip() for s in args.symbols.split(",") if s.strip())
    if args.null and args.snap_signal != 0.0:
        console.print("[red]--null plants no signal: it cannot be combined with --snap-signal[/]")
        return 2
    config = SynthConfig(
        symbols=symbols,
        quarters=tuple(quarter_range(args.quarters)),
        scale=args.scale,
        seed=args.seed,
        signal=0.0 if args.null else args.signal,
        book_ratio=args.book_ratio,
        snap_signal=args.snap_signal,
    )
    t0 = time.perf_counter()
    with _progress() as progress:
        report = generate_market(Path(args.out), config, progress=_progress_callback(progress))
    seconds = time.perf_counter() - t0
    summary = report.to_dict()
    summary["seconds"] = round(seconds, 2)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        console.print(f"wrote synthetic market to [bold]{args.out}[/] in {seconds:.1f}s")
        for f in summary.get("files", []):
            console.print(f"  {f}")
    return 0


# --- decode -------------------------------------------------------------------------------


def cmd_decode(args: argparse.Namespace) -> int:
    """Decode a DBN file into its predecoded sidecar (reused when fresh unless --rebuild).

    Imports only what decoding needs (the stage's code version comes from ``codeversion``, not
    from ``lineage``, which would load numba, pydantic and the feature registry) and shows a
    progress bar only on a terminal."""
    if "numpy" not in sys.modules:
        # A fresh `fx-assets decode` does no linear algebra: numpy's import need not start
        # (and spin up) an OpenBLAS thread pool, ~15% of the decode path's start-up CPU
        # (0.19 -> 0.16 s measured). Not when numpy is loaded: a caller's setting stays.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fx_assets.core.codeversion import stage_version
    from fx_assets.core.sidecar import ensure_sidecar

    src = Path(args.path)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such file")
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {
        "rebuild": args.rebuild,
        "chunk_bytes": args.chunk_mib << 20,
        "code_version": stage_version("predecoded"),
    }
    if sys.stderr.isatty():
        with _progress() as progress:
            task = progress.add_task(f"decode {src.name}", total=max(src.stat().st_size, 1))
            kwargs["progress"] = lambda done, total: progress.update(
                task, completed=done, total=max(total, 1)
            )
            info = ensure_sidecar(src, Path(args.out), **kwargs)
    else:
        info = ensure_sidecar(src, Path(args.out), **kwargs)
    seconds = time.perf_counter() - t0
    action = "reused" if info.reused else "decoded"
    sys.stderr.write(f"{action} {info.n_records:,} records -> {info.path} in {seconds:.2f}s\n")
    return 0


# --- inspect --------------------------------------------------------------------------------


def describe_path(path: Path) -> dict[str, Any]:
    """Describe a DBN file, a predecoded sidecar or an fxcache, chosen by content."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with path.open("rb") as fh:
        head = fh.read(8)
    if head.startswith(b"FXCACHE\0"):
        from fx_assets.core.fxcache import describe_fxcache

        return {"kind": "fxcache", **describe_fxcache(path)}
    if head.startswith(b"ARROW1"):
        from fx_assets.core.sidecar import describe_sidecar

        return {"kind": "sidecar", **describe_sidecar(path)}
    if head.startswith(b"DBN") or head.startswith(b"\x28\xb5\x2f\xfd"):
        from fx_assets.core.sidecar import describe_dbn

        return {"kind": "dbn", **describe_dbn(path)}
    raise ValueError(f"{path}: not a DBN file, an Arrow sidecar or an fxcache (magic {head!r})")


def _print_description(desc: dict[str, Any]) -> None:
    scalars = {k: v for k, v in desc.items() if not isinstance(v, list | dict)}
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{desc.get('kind', '?')}: {desc.get('path', '')}", show_header=False)
    for k, v in scalars.items():
        table.add_row(str(k), str(v))
    Console().print(table)
    for k, v in desc.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            t = Table(title=k)
            cols = list(v[0].keys())
            for c in cols:
                t.add_column(c)
            for row in v:
                t.add_row(*[_fmt(row.get(c)) for c in cols])
            Console().print(t)
        elif isinstance(v, dict | list):
            Console().print(f"[bold]{k}[/]: {json.dumps(v, default=str)[:2000]}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def cmd_inspect(args: argparse.Namespace) -> int:
    desc = describe_path(Path(args.path))
    if args.json:
        print(json.dumps(desc, indent=2, default=str))
    else:
        _print_description(desc)
    if desc.get("valid") is False:  # described, but it fails validation (e.g. a checksum)
        console.print(f"[red]invalid[/red]: {desc.get('error')}")
        return 1
    return 0


# --- export -------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    """fxcache -> Parquet or Arrow IPC, for people who want to look with other tools."""
    from fx_assets.core.fxcache import open_fxcache
    from fx_assets.core.tables import write_table

    src, out = Path(args.path), Path(args.out)
    cache = open_fxcache(src)
    if out.suffix == ".parquet":
        cache.export_parquet(out)
    elif out.suffix in (".arrow", ".feather", ".ipc"):
        write_table(out, cache.to_arrow())
    else:
        raise ValueError(f"{out}: choose a .parquet or .arrow output")
    console.print(f"wrote {cache.n_bars:,} bars x {len(cache.columns)} columns to {out}", soft_wrap=True)
    return 0


# --- download -------------------------------------------------------------------------------


def cmd_download(args: argparse.Namespace) -> int:
    """Quote, confirm and fetch Databento files into the raw layout (see fx_assets.core.download)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.table import Table

    from fx_assets.core import download as dl
    from fx_assets.core.calendar import quarter_range
    from fx_assets.core.paths import DataLayout
    from fx_assets.settings import load_settings

    root = Path(args.out) if args.out else load_settings().data_root
    requests = dl.plan(
        args.dataset,
        [s.strip().upper() for s in args.symbols.split(",") if s.strip()],
        [s.strip() for s in args.schemas.split(",") if s.strip()],
        quarter_range(args.quarters),
    )
    key = None
    try:
        key = dl.api_key_from_env()
        client = dl.make_client(key, args.gateway)
        quotes = dl.quote(
            client, requests, DataLayout(root), key=key, batch_threshold_bytes=int(args.batch_above_gb * 1e9)
        )
        table = Table(title=f"Databento {args.dataset} -> {root / 'raw'}")
        for col in ("symbol", "schema", "quarter", "records", "billable GB", "cost USD", "how"):
            table.add_column(
                col, justify="right" if col in ("records", "billable GB", "cost USD") else "left"
            )
        for q in quotes:
            r = q.request
            if q.present:
                table.add_row(r.symbol, r.schema, dl.quarter_label(r.quarter), "", "", "", "present, skipped")
            else:
                table.add_row(
                    r.symbol, r.schema, dl.quarter_label(r.quarter), f"{q.record_count:,}",
                    f"{q.billable_bytes / 1e9:,.3f}", f"{q.cost_usd:,.2f}", q.method,
                )  # fmt: skip
        t = dl.total(quotes)
        table.add_row("total", "", "", f"{t.record_count:,}", f"{t.billable_bytes / 1e9:,.3f}", f"{t.cost_usd:,.2f}",
                      f"{t.to_fetch} to fetch", style="bold")  # fmt: skip
        console.print(table)
        if t.to_fetch == 0:
            console.print("every file is already present; nothing to download")
            return 0
        dl.check_budget(quotes, args.max_cost)
        if not args.yes:
            if not sys.stdin.isatty():
                console.print("not confirmed: rerun with --yes to download (nothing was downloaded)")
                return 1
            answer = console.input(f"Download {t.to_fetch} file(s) for ${t.cost_usd:,.2f}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                console.print("nothing was downloaded")
                return 1
        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeElapsedColumn(), console=_real_console(),
        )  # fmt: skip
        with progress:
            tasks: dict[str, Any] = {}

            def on_progress(label: str, done: int, total: int | None) -> None:
                if label not in tasks:
                    tasks[label] = progress.add_task(label, total=total)
                progress.update(tasks[label], completed=done, total=total)

            results = dl.download(client, quotes, key=key, progress=on_progress)
        for res in results:
            console.print(
                f"{res.action:>8} {res.path} ({res.bytes:,} bytes)", soft_wrap=True, highlight=False
            )
        return 0
    except dl.DownloadError as exc:
        console.print(f"[red]error:[/] {dl.scrub(str(exc), key)}", soft_wrap=True, highlight=False)
        return 2


# --- demo -----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from fx_assets.demo import run_demo

    return run_demo(scale=args.scale, seed=args.seed, signal=args.signal, console=_real_console())


# --- entry point ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fx-assets", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synth", help="write a synthetic ES-like market as genuine DBN files")
    p.add_argument("--out", required=True, help="data root to write raw/{trades,mbp-10}/... under")
    p.add_argument("--symbols", default="ES.FUT", help="comma-separated parent symbols (default ES.FUT)")
    p.add_argument("--quarters", default="2024-Q1:2024-Q4", help="quarter or range, e.g. 2024-Q1:2024-Q4")
    p.add_argument("--scale", type=float, default=1.0, help="1.0 ≈ 20 M trades per quarter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--book-ratio", type=float, default=0.1, help="book (MBP-10) records per trade")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--signal", type=float, default=0.0, help="planted order-flow signal strength")
    g.add_argument("--null", action="store_true", help="plant no signal of either kind (the default)")
    p.add_argument(
        "--snap-signal",
        type=float,
        default=0.0,
        help="planted event-time signal: level-1 imbalance -> mid ~20-50 book updates ahead "
        "(ticks per unit response; 0 = off; not with --null)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("decode", help="decode a DBN file into its memory-mappable Arrow sidecar")
    p.add_argument("path", help="a .dbn or .dbn.zst file (trades, mbp-1, tbbo or mbp-10)")
    p.add_argument("--out", required=True, help="sidecar directory")
    p.add_argument("--rebuild", action="store_true", help="decode again even if the sidecar is fresh")
    p.add_argument(
        "--chunk-mib",
        type=int,
        default=1,
        help="decompressed MiB per chunk (bounds memory; default as the asset)",
    )
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser("inspect", help="describe a DBN file, a sidecar (.arrow) or an fxcache")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("export", help="convert an fxcache to Parquet or Arrow IPC")
    p.add_argument("path", help="the .fxcache file")
    p.add_argument("out", help="output file: .parquet or .arrow")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("download", help="quote and download Databento files into the raw layout")
    p.add_argument("--dataset", default="GLBX.MDP3", help="Databento dataset (default GLBX.MDP3)")
    p.add_argument("--symbols", default="ES.FUT", help="comma-separated parent symbols (stype_in=parent)")
    p.add_argument("--schemas", default="trades,mbp-10", help="comma-separated: trades, mbp-10")
    p.add_argument("--quarters", required=True, help="quarter or range, e.g. 2024-Q1:2024-Q4")
    p.add_argument("--out", help="data root (default: FX_DATA_ROOT / the project settings)")
    p.add_argument("--yes", action="store_true", help="download without asking after the cost table")
    p.add_argument("--max-cost", type=float, help="refuse when the estimated total is above this (USD)")
    p.add_argument("--batch-above-gb", type=float, default=5.0,
                   help="use a batch job for files whose billable (uncompressed) size exceeds this (GB)")  # fmt: skip
    p.add_argument("--gateway", help="historical API gateway URL (default: Databento's)")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("demo", help="synthesise a small market and materialize every asset")
    p.add_argument("--scale", type=float, default=DEMO_SCALE)
    p.add_argument("--seed", type=int, default=DEMO_SEED)
    p.add_argument("--signal", type=float, default=DEMO_SIGNAL)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`fx-assets inspect … | head`): stop quietly, as a SIGPIPE'd tool does.
        # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
