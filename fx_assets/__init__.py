"""fx_assets: a Dagster code location from Databento DBN archives to walk-forward models."""

from fx_assets.core.malloc_arena import use_one_arena
from fx_assets.core.numba_cache import use_versioned_cache
from fx_assets.core.numba_startup import defer_blas_probe

# Before any worker thread exists: freed memory of the stages' thread pools must return to the
# heap that each run trims (core/malloc_arena.py says why).
use_one_arena()

# Before any module with cached kernels is imported: numba's cache keyed by every source file,
# so an edit of one module never leaves another module's kernels stale (core/numba_cache.py).
use_versioned_cache()

# Before numba loads its registries (a process's first kernel): its BLAS probe would import
# scipy.linalg, ~0.15 s of every run process's start, for no kernel here (core/numba_startup.py).
defer_blas_probe()

__version__ = "0.1.0"
