"""fx_assets: a Dagster code location from Databento DBN archives to walk-forward models."""

from fx_assets.core.malloc_arena import use_one_arena
from fx_assets.core.numba_cache import use_versioned_cache

# Before any worker thread exists: freed memory of the stages' thread pools must return to the
# heap that each run trims (core/malloc_arena.py says why).
use_one_arena()

# Before any module with cached kernels is imported: numba's cache keyed by every source file,
# so an edit of one module never leaves another module's kernels stale (core/numba_cache.py).
use_versioned_cache()

__version__ = "0.1.0"
