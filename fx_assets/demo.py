"""``fx-assets demo``: synthesise a small market and materialize every asset into the project's
Dagster instance, so ``make ui`` shows the runs, the partitions and their metadata.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dagster as dg
from rich.console import Console

from fx_assets.core.calendar import quarter_label
from fx_assets.core.synth import SynthConfig, generate_market
from fx_assets.partitions import QuarterSymbol, partition_key
from fx_assets.settings import ProjectSettings, load_settings


def demo_quarters(settings: ProjectSettings) -> list:
    from fx_assets.core.calendar import next_quarter

    if settings.last_quarter is None:
        raise ValueError("the demo needs FX_LAST_QUARTER (the Makefile sets 2024-Q4)")
    out = [settings.first_quarter]
    while out[-1] < settings.last_quarter:
        out.append(next_quarter(out[-1]))
    return out


def ensure_synthetic_market(settings: ProjectSettings, config: SynthConfig, console: Console) -> None:
    """Generate the market unless the data root already holds one made with the same config."""
    manifest = settings.data_root / "raw" / "synth_manifest.json"
    wanted = json.loads(json.dumps(config.to_dict(), default=str))
    if manifest.is_file():
        have = json.loads(manifest.read_text()).get("config")
        if have == wanted:
            console.print(f"synthetic market already in {settings.data_root} (same config): reused")
            return
    console.print(f"generating a synthetic market in {settings.data_root} …")
    t0 = time.perf_counter()
    generate_market(settings.data_root, config)
    console.print(f"  done in {time.perf_counter() - t0:.1f}s")


#: Keep the console to our own progress lines; every event is still in the instance (make ui).
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_demo(*, scale: float, seed: int, signal: float, console: Console) -> int:
    settings = load_settings()
    if not os.environ.get("DAGSTER_HOME"):
        raise ValueError("DAGSTER_HOME is not set: run the demo through `make demo`")
    quarters = demo_quarters(settings)
    config = SynthConfig(
        symbols=settings.symbols, quarters=tuple(quarters), scale=scale, seed=seed, signal=signal
    )
    ensure_synthetic_market(settings, config, console)

    from fx_assets.definitions import FEATURE_STAGES, build_definitions
    from fx_assets.partitions import training_partitions

    defs = build_definitions(settings)
    instance = dg.DagsterInstance.get()
    resources = dict(defs.resources or {})
    feature_stages = list(FEATURE_STAGES)

    # Every run goes through the project's named jobs, so `make ui` lists them under
    # observe_raw / build_features / train_models / walk_forward (not an ephemeral job).
    console.print("observing raw sources …")
    # Twice: a raw file is reported once it is unchanged between two observations.
    for _ in range(2):
        observed = defs.resolve_job_def("observe_raw").execute_in_process(
            instance=instance, resources=resources, run_config=QUIET, raise_on_error=False
        )
        if not observed.success:
            console.print(f"[red]observe_raw: run {observed.run_id} failed (see make ui → Runs)[/]")
            return 1

    console.print("building features, one run per partition …")
    build_features = defs.resolve_job_def("build_features")
    for q in quarters:
        for symbol in settings.symbols:
            part = QuarterSymbol(q, symbol)
            t0 = time.perf_counter()
            result = build_features.execute_in_process(
                partition_key=partition_key(q, symbol),
                instance=instance,
                resources=resources,
                run_config=QUIET,
                raise_on_error=False,
            )
            if not result.success:
                console.print(f"[red]{part.label}: run {result.run_id} failed (see make ui → Runs)[/]")
                return 1
            console.print(f"  {part.label}: {len(feature_stages)} assets in {time.perf_counter() - t0:.1f}s")

    train_parts = training_partitions(settings)
    if train_parts is None:
        console.print("[yellow]too few quarters for a walk-forward fold: training skipped[/]")
    else:
        keys = sorted(str(k) for k in train_parts.get_partition_keys())
        console.print(f"training {len(keys)} fold(s) in one run (device loader: one upload per quarter) …")
        t0 = time.perf_counter()
        for symbol in settings.symbols:
            sym_keys = [k for k in keys if k.endswith(f"|{symbol}")]
            job = defs.resolve_job_def("train_models")
            result = job.execute_in_process(
                instance=instance,
                resources=resources,
                run_config=QUIET,
                tags={
                    "dagster/asset_partition_range_start": sym_keys[0],
                    "dagster/asset_partition_range_end": sym_keys[-1],
                },
                raise_on_error=False,
            )
            if not result.success:
                console.print(f"[red]training {symbol}: run {result.run_id} failed[/]")
                return 1
        console.print(f"  done in {time.perf_counter() - t0:.1f}s")
        report = defs.resolve_job_def("walk_forward").execute_in_process(
            instance=instance, resources=resources, run_config=QUIET, raise_on_error=False
        )
        if not report.success:
            console.print(f"[red]walk_forward_report: run {report.run_id} failed[/]")
            return 1
        for ev in report.get_asset_materialization_events():
            md = ev.materialization.metadata
            for symbol in settings.symbols:
                if f"{symbol}_sharpe" in md:
                    console.print(
                        f"  {symbol} out-of-sample: Sharpe {md[f'{symbol}_sharpe'].value}, "
                        f"max drawdown {md[f'{symbol}_max_drawdown'].value}"
                    )

    root = Path(settings.data_root).resolve()
    first = (
        f"{root}/raw/trades/{settings.symbols[0]}/{settings.symbols[0]}_{quarter_label(quarters[0])}.dbn.zst"
    )
    console.print("\n[bold green]demo complete.[/] Next:")
    for line in (
        "  make ui      # Dagster UI at http://127.0.0.1:3000: Assets (lineage, partitions, metadata), Runs",
        f"  ls {root}/derived      # sidecars and derived files (cache key in each name)",
        f"  .venv/bin/fx-assets inspect {first}",
        f"  ls {root}/models {root}/reports      # checkpoints (safetensors + JSON), report",
    ):
        console.print(line, soft_wrap=True, highlight=False)
    return 0
