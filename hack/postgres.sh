#!/usr/bin/env bash
# PostgreSQL for the tests of Keelson's backup, restore and replication
# scripts: Debian's postgresql-15 server binaries. The tests start their own
# servers on 127.0.0.1 (never the package's default cluster).
#
#   hack/postgres.sh ensure-installed   install postgresql-15 if missing
#   hack/postgres.sh bindir             print the folder with initdb, pg_ctl, ...
set -euo pipefail
PG_MAJOR="${KEELSON_PG_MAJOR:-15}"
BINDIR="/usr/lib/postgresql/$PG_MAJOR/bin"
log() { printf '[postgres %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

case "${1:-}" in
  ensure-installed)
    if [[ -x "$BINDIR/initdb" && -x "$BINDIR/pg_dump" ]] && id postgres >/dev/null 2>&1; then
      exit 0
    fi
    command -v apt-get >/dev/null || { log "postgresql-$PG_MAJOR is missing and apt-get is not available"; exit 1; }
    log "installing postgresql-$PG_MAJOR from Debian's packages"
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "postgresql-$PG_MAJOR" >/dev/null
    log "installed: $("$BINDIR/postgres" --version)"
    ;;
  bindir) echo "$BINDIR" ;;
  *) echo "usage: $0 ensure-installed|bindir" >&2; exit 2 ;;
esac
