"""Wall time per phase of an e2e test, printed at its end (``pytest -s`` shows it): where the
minutes of a run through ``dagster dev`` go."""

import sys
import time


class Phases:
    """Wall time per phase, printed at the end (pytest -s shows it): where e2e time goes."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.rows: list[tuple[str, float]] = []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.rows.append((name, now - self.t))
        self.t = now

    def report(self) -> None:
        print("\n" + ", ".join(f"{n} {s:.0f}s" for n, s in self.rows), file=sys.stderr)
