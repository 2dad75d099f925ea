"""Pure computation (no Dagster): decoding, calendars, bars, features, caches, training."""
