"""numba's on-disk kernel cache, in a directory named by the package's sources.

numba judges a cached kernel by the timestamp and size of the kernel's own source file only.
The kernels here call helpers of other modules (``active_contract._kept_trade``,
``book._valid_touch``, ``calendar.interval_of``, ...), and numba compiles a helper's code into
each kernel that calls it. After an edit of a helper's module, the cached kernels of the other
modules still look fresh, and a process runs them with the old helper inside; the stage cache
keys, which follow every source file (:mod:`fx_assets.core.codeversion`), would then label old
results as the new code's. So the kernels are cached under ``numba-<fingerprint>``, the
fingerprint being :func:`stat_fingerprint` (path, size and modification time of every source
file of the package: numba's own test, over all of them): any edit, of any module, starts from
an empty cache. Within one directory the sources cannot
have changed, so numba's own check is enough there.

The directory sits in ``$NUMBA_CACHE_DIR`` when the user set it, else in ``~/.cache/fx_assets``
(beside the code-version cache; a temporary directory when that is not writable, never numba's
in-tree ``__pycache__``). The newest :data:`KEEP` directories are kept; older ones (earlier
source states: edits, upgrades, other worktrees) are removed.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

KEEP = 6  # cache directories kept (one per source state)
PREFIX = "numba-"
ROOT_ENV = "FX_NUMBA_CACHE_ROOT"  # the root this package chose, for its child processes


def use_versioned_cache(fingerprint: str | None = None, base: Path | None = None) -> Path:
    """Point numba's cache at ``base / numba-<fingerprint>`` (defaults: the package's source
    fingerprint; ``$NUMBA_CACHE_DIR`` or ``~/.cache/fx_assets``) and prune older directories.

    Must run before the modules that define cached kernels are imported: numba fixes a
    kernel's cache location when its decorator runs. numba itself is not imported here (the
    decoder's command line does without it): the location goes into ``NUMBA_CACHE_DIR``, which
    numba reads when it is imported (and into its config if it already is). Child processes
    inherit that variable; ``FX_NUMBA_CACHE_ROOT`` tells an fx_assets child that it was set
    here, so the child keys its own sources under the same root instead of nesting in it."""
    from fx_assets.core.codeversion import _cache_dir

    name = f"{PREFIX}{fingerprint or stat_fingerprint(Path(__file__).resolve().parents[1])}"
    env_dir = os.environ.get("NUMBA_CACHE_DIR")
    set_here = os.environ.get(ROOT_ENV)
    if base is not None:
        first = base
    elif (
        env_dir
        and set_here
        and Path(env_dir).parent == Path(set_here)
        and Path(env_dir).name.startswith(PREFIX)
    ):
        first = Path(set_here)  # a parent fx_assets process chose it: same root, own sources
    else:
        first = Path(env_dir) if env_dir else _cache_dir()
    # an unwritable home must not send numba back to its __pycache__ caches (the stale ones)
    for root in (first, Path(tempfile.gettempdir()) / f"fx_assets-{os.getuid()}"):
        path = root / name
        try:
            path.mkdir(parents=True, exist_ok=True)
            os.utime(path)  # in use: the newest, whatever pruning another process does
            if os.access(path, os.W_OK):
                prune(root, KEEP, path)
                break
        except OSError:
            continue
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    os.environ[ROOT_ENV] = str(path.parent)
    numba = sys.modules.get("numba")
    if numba is not None:  # imported before fx_assets: its config has read the variable already
        numba.config.CACHE_DIR = str(path)
    return path


def stat_fingerprint(package_dir: Path) -> str:
    """:func:`codeversion.tree_fingerprint` of the package's sources by path, size and
    modification time: numba's own staleness test, taken over all the files at once. Stat calls
    only, no file read when the package is imported: with the sources read and hashed there, the
    warm stages ran 0.3-0.5 s slower in an ad hoc A/B (3 rounds each, fresh processes), likely
    through glibc's heap state (the reads leave freed blocks that change which later arrays are
    faulted in afresh; the benchmarks' README has a measured case)."""
    from fx_assets.core.codeversion import tree_fingerprint

    return tree_fingerprint(package_dir, content=False)


def prune(root: Path, keep: int, current: Path) -> list[Path]:
    """Remove the ``numba-*`` directories of ``root`` beyond the ``keep`` newest (by mtime),
    never ``current``; returns those removed."""
    dirs = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and p != current]
    dirs.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    gone = dirs[max(keep - 1, 0) :]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
