"""Loading the code location imports no heavy library it does not run (issue 10, the path people
run): every run process, the webserver and the daemon import ``fx_assets.definitions``, and a
feature run never touches torch (~2.4 s of a fresh process), matplotlib, LightGBM or pandas.
Those load inside the steps that use them (training, the report pictures, the GBT baseline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Top-level packages the definitions must not import.
HEAVY = ("torch", "triton", "matplotlib", "lightgbm", "pandas", "safetensors", "sklearn", "scipy")


def loaded_after(statement: str) -> list[str]:
    """The modules of the HEAVY packages loaded in a fresh interpreter after ``statement``."""
    script = (
        f"import json, sys; {statement}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r})))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_loading_the_definitions_imports_no_heavy_library() -> None:
    got = set(loaded_after("import fx_assets.definitions; fx_assets.definitions.defs"))
    # numba's import checks the installed SciPy's version (``import scipy``, the bare package,
    # ~4 ms); nothing of SciPy beyond what that import loads may come in.
    allowed = set(loaded_after("import scipy"))
    extra = got - allowed
    assert not extra, (
        f"fx_assets.definitions loads {sorted({m.split('.')[0] for m in extra})} ({len(extra)} modules)"
    )


def test_the_training_names_still_resolve_and_bring_torch() -> None:
    """The lazily imported trainer names are the real functions (the package API holds)."""
    got = loaded_after(
        "from fx_assets.core.trainers import fold_transition, train_dqn, train_mlp; "
        "from fx_assets.core.trainers.mlp import train_mlp as m; assert train_mlp is m"
    )
    assert "torch" in got


def test_no_numba_kernel_is_loaded_at_import() -> None:
    """Kernels are compiled or read from numba's cache on first call (no eager signatures), so
    a run pays only for the kernels of the stages it executes."""
    script = (
        "import gc, fx_assets.definitions; from numba.core.registry import CPUDispatcher; "
        "ds = [o for o in gc.get_objects() if isinstance(o, CPUDispatcher) "
        "and o.py_func.__module__.startswith('fx_assets')]; "
        "print(len(ds), sorted(d.py_func.__qualname__ for d in ds if d.overloads))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    n, loaded = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(n) > 10, "the kernels were not found (the check would pass vacuously)"
    assert loaded == "[]", f"kernels loaded at import: {loaded}"


def test_stage_tables_round_trip_without_pandas() -> None:
    """Writing and reading the roll calendar, bars and bar-feature tables loads no pandas:
    ``pa.array`` / ``to_numpy`` / ``to_pydict`` import it on first use (~0.3 s CPU in every
    run process of these stages); ``tables.array_of`` & co. read and write the buffers."""
    statement = (
        "import datetime as dt, tempfile, pathlib, numpy as np; "
        "from fx_assets.core import tables; "
        "from fx_assets.core.active_contract import roll_calendar_from_table; "
        "from fx_assets.core.bar_features import FeatureTable, compute_bar_features; "
        "from fx_assets.core.bars import BarConfig, BarTable, build_bars; "
        "from fx_assets.core.roll import RollCalendar; "
        "d = pathlib.Path(tempfile.mkdtemp()); "
        "cal = RollCalendar(np.array([19900, 19901], np.int32), np.array([7, 8], np.uint32), "
        "('ESU4', None), (dt.date(2024, 9, 20), None), np.array([False, True]), ()); "
        "tables.write_table(d / 'r.arrow', cal.to_arrow()); "
        "back = roll_calendar_from_table(tables.read_table(d / 'r.arrow')); "
        "assert back.raw_symbol == cal.raw_symbol and back.expiry == cal.expiry; "
        "n = 4000; ts = 1_720_000_000_000_000_000 + np.arange(n, dtype=np.int64) * 10**9; "
        "bars = build_bars(ts, 5000 + np.sin(np.arange(n)), np.ones(n), np.zeros(n, np.int8), "
        "np.full(n, 19900, np.int32), np.full(n, 7, np.uint32), BarConfig(volume_bar_size=5)); "
        "tables.write_table(d / 'b.arrow', bars.to_arrow()); "
        "bars = BarTable.from_arrow(tables.read_table(d / 'b.arrow')); "
        "f = compute_bar_features(bars); tables.write_table(d / 'f.arrow', f.to_arrow()); "
        "FeatureTable.from_arrow(tables.read_table(d / 'f.arrow'))"
    )
    got = [m for m in loaded_after(statement) if m.split(".")[0] == "pandas"]
    assert not got, f"the stage tables load pandas ({len(got)} modules)"


def test_a_feature_run_imports_no_pandas(market3: Path, tmp_path: Path) -> None:
    """A ``build_features`` run, asset checks included, loads no pandas: every stage reads and
    writes Arrow through ``fx_assets.core.tables`` (pyarrow's ``pa.array`` / ``to_numpy`` import
    pandas on first use, ~0.3 s CPU in every run process). Q1, then Q2 warmed up from Q1, then Q2
    again (every file reused and verified), in one fresh process."""
    root = tmp_path / "data"
    shutil.copytree(market3 / "raw", root / "raw")
    script = f"""
import datetime as dt, json, sys
import dagster as dg
from fx_assets.definitions import build_definitions
from fx_assets.partitions import partition_key
from fx_assets.settings import ProjectSettings
q1, q2 = dt.date(2024, 1, 1), dt.date(2024, 4, 1)
defs = build_definitions(ProjectSettings(data_root={str(root)!r}, first_quarter=q1, last_quarter=q2))
job = defs.resolve_job_def("build_features")
quiet = {{"loggers": {{"console": {{"config": {{"log_level": "ERROR"}}}}}}}}
actions, checks = [], 0
with dg.instance_for_test() as inst:
    for q in (q1, q2, q2):
        r = job.execute_in_process(instance=inst, partition_key=partition_key(q, "ES.FUT"), run_config=quiet)
        assert r.success
        checks += sum(e.passed for e in r.get_asset_check_evaluations())
        for ev in r.get_asset_materialization_events():
            if ev.asset_key.to_user_string() == "ofi_features":
                actions.append(ev.materialization.metadata["action"].value)
print(json.dumps([actions, checks, sorted(m for m in sys.modules if m.split(".")[0] == "pandas")]))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    actions, checks, pandas = json.loads(out.stdout.strip().splitlines()[-1])
    assert actions == ["built", "built", "reused"] and checks > 0, (actions, checks)
    assert not pandas, f"a feature run loads pandas ({len(pandas)} modules)"


def test_empty_stage_tables_without_pandas(tmp_path: Path) -> None:
    """A quarter without data (an empty raw file, a roll calendar of no rows) is no pandas path
    either: ``pa.array([])`` and ``combine_chunks`` of no chunks import it (``tables.empty_array``)."""
    from fx_assets.core import dbn
    from fx_assets_tests.core.test_dbn import TRADES_V1, write_dbn

    raw = write_dbn(tmp_path / "empty.dbn.zst", dbn.read_header(TRADES_V1).header_bytes, b"", zstd=True)
    statement = (
        "import pathlib, numpy as np; "
        "from fx_assets.core import tables; "
        "from fx_assets.core.active_contract import roll_calendar_from_table; "
        "from fx_assets.core.roll import RollCalendar; "
        "from fx_assets.core.sidecar import ensure_sidecar, sidecar_columns; "
        f"d = pathlib.Path({str(tmp_path)!r}); "
        "info = ensure_sidecar(d / 'empty.dbn.zst', d / 'sc'); "
        "assert info.n_records == 0 and len(sidecar_columns(info.path)['ts_recv']) == 0; "
        "cal = RollCalendar(np.zeros(0, np.int32), np.zeros(0, np.uint32), (), (), np.zeros(0, bool), ()); "
        "tables.write_table(d / 'r.arrow', cal.to_arrow()); "
        "assert len(roll_calendar_from_table(tables.read_table(d / 'r.arrow'))) == 0"
    )
    assert raw.exists()
    got = [m for m in loaded_after(statement) if m.split(".")[0] == "pandas"]
    assert not got, f"the empty stage tables load pandas ({len(got)} modules)"
