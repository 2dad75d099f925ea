#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the tests marked `postgres`, then run them.
# Installs the server from Debian if the machine has none. Runs as root (CI); the server itself
# runs as an unprivileged user, as PostgreSQL requires.
set -euo pipefail
cd "$(dirname "$0")/.."

find_bin() {
  command -v "$1" 2>/dev/null && return
  ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1
}
if [[ -z "$(find_bin initdb)" ]]; then
  echo "installing postgresql (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
INITDB=$(find_bin initdb); PG_CTL=$(find_bin pg_ctl)
id fxpg >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin fxpg
DIR=$(mktemp -d /tmp/fx-pg.XXXXXX); chown fxpg "$DIR"; chmod 700 "$DIR"
PORT=${FX_PG_PORT:-54329}
runuser -u fxpg -- "$INITDB" -D "$DIR/data" -U fx --auth=trust >/dev/null
runuser -u fxpg -- "$PG_CTL" -D "$DIR/data" -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" -l "$DIR/log" -w start >/dev/null
trap 'runuser -u fxpg -- "$PG_CTL" -D "$DIR/data" -m fast stop >/dev/null; rm -rf "$DIR"' EXIT
export PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=fx PGPASSWORD=unused PGDATABASE=postgres
# each test makes its own database and dagster dev port, so the two run side by side
.venv/bin/python -m pytest -q -m postgres -p no:cacheprovider -n 2 --dist loadfile --durations=5
