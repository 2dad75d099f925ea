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


def run_demo(*, scale: float, seed: int, signal: float, console: Console) -> int:
    settings = load_settings()
    if not os.environ.get("DAGSTER_HOME"):
        raise ValueError("DAGSTER_HOME is not set: run the demo through `make demo`")
    quarters = demo_quarters(settings)
    config = SynthConfig(
        symbols=settings.symbols, quarters=tuple(quarters), scale=scale, seed=seed, signal=signal
    )
    ensure_synthetic_market(settings, config, console)

    from fx_assets.definitions import build_definitions

    defs = build_definitions(settings)
    instance = dg.DagsterInstance.get()
    assets = list(defs.assets or [])
    resources = dict(defs.resources or {})
    by_name = {a.key.to_user_string(): a for a in assets if isinstance(a, dg.AssetsDefinition)}
    sources = [a for a in assets if not isinstance(a, dg.AssetsDefinition) or a.is_observable]
    per_partition = [
        name for name in ("predecoded_trades", "predecoded_mbp10", "roll_calendar") if name in by_name
    ]

    from dagster._core.definitions.observe import observe

    console.print("observing raw sources …")
    observe(sources, instance=instance, resources=resources)

    for q in quarters:
        for symbol in settings.symbols:
            part = QuarterSymbol(q, symbol)
            t0 = time.perf_counter()
            result = dg.materialize(
                assets,
                selection=per_partition,
                partition_key=partition_key(q, symbol),
                instance=instance,
                resources=resources,
            )
            if not result.success:
                console.print(f"[red]{part.label}: run {result.run_id} failed[/]")
                return 1
            console.print(
                f"  {quarter_label(q)}|{symbol}: {', '.join(per_partition)} in {time.perf_counter() - t0:.1f}s"
            )

    root = Path(settings.data_root).resolve()
    console.print(
        "\n[bold green]demo complete.[/] Next:\n"
        "  make ui                         # Dagster UI at http://127.0.0.1:3000 (Assets, Runs)\n"
        f"  ls {root}/derived               # sidecars and derived files (cache key in each name)\n"
        f"  .venv/bin/fx-assets inspect {root}/raw/trades/{settings.symbols[0]}/"
        f"{settings.symbols[0]}_{quarter_label(quarters[0])}.dbn.zst\n"
    )
    return 0
