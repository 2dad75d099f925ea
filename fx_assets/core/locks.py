"""Build locks and the clean-up of dead writers' temporary files.

Two runs that need the same derived file (a sidecar, a keyed stage table) serialise on an
advisory ``fcntl.flock`` of a lock file beside it (``.NAME.lock``): the second waits until
the first has renamed its output into place, then finds it and reuses it instead of building
it again. Readers take no lock: outputs are replaced with ``os.replace`` (the old file stays
readable until the new one is renamed over it), so a reader never sees a missing file.

Lock files are left in place (removing one would race with a process about to lock it). The
lock is released by the kernel when its holder dies. ``flock`` works across processes of one
host (and on NFS v4 through ``fcntl`` emulation); it is not a cluster-wide lock.

Temporary files of :func:`fx_assets.core.atomic.atomic_path` are named ``.NAME.tmp-PID-xxxxxxxx``;
a writer killed before its rename leaves one behind. :func:`remove_orphans` deletes those
whose PID no longer runs on this host (called with the lock held, when a new build starts).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from fx_assets.core.errors import FxDataError

__all__ = ["build_lock", "lock_path", "remove_orphans"]

_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")


def lock_path(final: Path | str) -> Path:
    """The lock file that guards the build of ``final``."""
    final = Path(final)
    return final.with_name(f".{final.name}.lock")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def remove_orphans(final: Path | str) -> list[Path]:
    """Remove the temporary files of ``final`` left by writers that are no longer running."""
    final = Path(final)
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    for p in final.parent.iterdir():
        m = _TMP_NAME.match(p.name)
        if m is None or m["name"] != final.name or _pid_alive(int(m["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed


@contextlib.contextmanager
def build_lock(final: Path | str) -> Iterator[list[Path]]:
    """Hold the exclusive build lock of ``final`` (waiting for another holder to finish).

    On entry the dead writers' temporary files of ``final`` are removed; the context value is
    the list of removed paths.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(final)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise FxDataError(f"{path}: cannot create the build lock of {final.name}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield remove_orphans(final)
    finally:
        os.close(fd)  # closing releases the lock
