#!/usr/bin/env bash
# Browser test set-up, then the tests marked `browser`: Debian's Chromium (apt) driven by
# Playwright for Python (pip, version from pyproject's `browser` extra). Playwright's own browser
# download is never used (it is not reachable from CI); the test launches /usr/bin/chromium.
# Idempotent: each piece is installed only when missing. Runs as root (CI).
# Screenshots: artifacts/screenshots/ (kept by CI as artifacts).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! "$PY" -c "import playwright" 2>/dev/null; then
  req=$("$PY" -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['browser'])")
  echo "installing $req (pip)"
  "$PY" -m pip install -q $req
fi
if [[ "${1:-}" == "--setup-only" ]]; then exit 0; fi
"$PY" -m pytest -q -p no:xdist -p no:cacheprovider -m browser fx_assets_tests/e2e
