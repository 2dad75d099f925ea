"""fx_assets: a Dagster code location from Databento DBN archives to walk-forward models."""

from fx_assets.core.malloc_arena import use_one_arena

# Before any worker thread exists: freed memory of the stages' thread pools must return to the
# heap that each run trims (core/malloc_arena.py says why).
use_one_arena()

__version__ = "0.1.0"
