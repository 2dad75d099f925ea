"""numba's cache keyed by the package's sources (core/numba_cache.py): the stale-kernel case it
exists for (a cached kernel with another module's helper compiled in, after an edit of that
helper's module), where it puts the cache, and the pruning of older source states."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import pytest

import fx_assets
from fx_assets.core import numba_cache
from fx_assets.core.codeversion import _cache_dir

HELPER = """
from numba import njit

@njit(cache=True, inline="always")
def step(x):
    return x + {inc}
"""
KERNEL = """
from numba import njit
from pkgx.helper import step

@njit(cache=True)
def kernel(x):
    return step(x) * 2
"""


def _run(pkg_root: Path, versioned: bool, cache_base: Path) -> int:
    """kernel(1) in a fresh process, with numba's default (in-tree) caching or the versioned one."""
    fp = hashlib.sha256(
        b"".join(p.read_bytes() for p in sorted((pkg_root / "pkgx").glob("*.py")))
    ).hexdigest()
    setup = (
        f"from fx_assets.core.numba_cache import use_versioned_cache; "
        f"use_versioned_cache({fp[:32]!r}, __import__('pathlib').Path({str(cache_base)!r}))"
        if versioned
        else "pass"
    )
    code = f"{setup}\nfrom pkgx.kernel import kernel\nprint(kernel(1))"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(pkg_root), str(Path(fx_assets.__file__).parents[1])])
    )
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("versioned", [False, True])
def test_an_edit_of_a_helpers_module_reaches_the_cached_kernels_of_other_modules(
    tmp_path: Path, versioned: bool
) -> None:
    """numba's own check looks at the kernel's file only: after the helper's module changes,
    the in-tree cache still serves the kernel compiled with the old helper (kernel(1) = 4, not
    6). Keyed by the sources, the edit starts a new cache and the kernel sees the new helper."""
    pkg = tmp_path / "src" / "pkgx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text(HELPER.format(inc=1))
    (pkg / "kernel.py").write_text(KERNEL)
    base = tmp_path / "cache"
    assert _run(tmp_path / "src", versioned, base) == 4
    time.sleep(0.01)
    (pkg / "helper.py").write_text(HELPER.format(inc=2))
    got = _run(tmp_path / "src", versioned, base)
    # numba's in-tree cache: stale (the reason core/numba_cache.py exists); versioned: fresh
    assert got == (6 if versioned else 4)


def _child_cache_dir(env: dict[str, str]) -> str:
    code = "import fx_assets, numba; print(numba.config.CACHE_DIR)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_package_uses_a_cache_named_by_its_sources(tmp_path: Path) -> None:
    """Importing fx_assets points numba at numba-<stat fingerprint of its sources> under ~/.cache/fx_assets,
    or under $NUMBA_CACHE_DIR when the user set it; a child process that inherits the variable
    from an fx_assets parent uses the same root (it does not nest a directory in the parent's)."""
    fp = numba_cache.stat_fingerprint(Path(fx_assets.__file__).resolve().parent)
    here = os.environ["NUMBA_CACHE_DIR"]
    assert numba.config.CACHE_DIR == here == str(Path(os.environ[numba_cache.ROOT_ENV]) / f"numba-{fp}")
    plain = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", numba_cache.ROOT_ENV)}
    assert _child_cache_dir(plain) == str(_cache_dir() / f"numba-{fp}")
    assert _child_cache_dir(dict(plain, NUMBA_CACHE_DIR=str(tmp_path))) == str(tmp_path / f"numba-{fp}")
    assert _child_cache_dir(dict(os.environ)) == here  # inherited from this process
    user = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"))  # set by the user in between
    assert _child_cache_dir(user) == str(tmp_path / "mine" / f"numba-{fp}")


def test_the_fingerprint_follows_every_source_file(tmp_path: Path) -> None:
    """An edit of any file (its size or modification time), an added file: a new fingerprint."""
    pkg = tmp_path / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    seen = {numba_cache.stat_fingerprint(pkg)}
    os.utime(pkg / "sub" / "b.py", ns=(1, 1))  # same content, other time
    seen.add(numba_cache.stat_fingerprint(pkg))
    (pkg / "a.py").write_text("x = 10\n")
    seen.add(numba_cache.stat_fingerprint(pkg))
    (pkg / "c.py").write_text("")
    seen.add(numba_cache.stat_fingerprint(pkg))
    assert len(seen) == 4
    assert numba_cache.stat_fingerprint(pkg) == numba_cache.stat_fingerprint(pkg)


def test_older_source_states_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest KEEP directories stay (the one in use whatever its age); older ones go."""
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)  # restored after
    for var in ("NUMBA_CACHE_DIR", numba_cache.ROOT_ENV):
        monkeypatch.setenv(var, os.environ[var])
    for i in range(numba_cache.KEEP + 3):
        d = tmp_path / f"numba-{i:02d}"
        d.mkdir()
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "codeversions-x.json").write_text("{}")  # not ours to prune
    path = numba_cache.use_versioned_cache("current", tmp_path)
    assert numba.config.CACHE_DIR == str(path) == str(tmp_path / "numba-current")
    left = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"numba-{i:02d}" for i in range(numba_cache.KEEP + 3)][-(numba_cache.KEEP - 1) :]
    assert left == sorted(["codeversions-x.json", "numba-current", *newest])
