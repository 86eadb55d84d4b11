#!/usr/bin/env bash
# promtool, to check Keelson's alert rules and dashboard queries: taken from
# Debian's prometheus package (downloaded and unpacked, never installed: no
# service starts), cached outside the work tree.
#
#   hack/promtool.sh path    print promtool's path, fetching it first if missing
set -euo pipefail
CACHE="${KEELSON_CACHE:-$HOME/.cache/keelson}/promtool"
log() { printf '[promtool %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
case "${1:-}" in
  path)
    if [[ ! -x "$CACHE/usr/bin/promtool" ]]; then
      command -v apt-get >/dev/null || { log "promtool is missing and apt-get is not available"; exit 1; }
      log "fetching promtool from Debian's prometheus package"
      work="$(mktemp -d)"
      trap 'rm -rf "$work"' EXIT
      ( cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1 ) \
        || { SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"; $SUDO apt-get update -qq; ( cd "$work" && apt-get download -qq prometheus >/dev/null ); }
      mkdir -p "$CACHE"
      dpkg -x "$work"/prometheus_*.deb "$work/root"
      install -D -m 0755 "$work/root/usr/bin/promtool" "$CACHE/usr/bin/promtool"
      log "$("$CACHE/usr/bin/promtool" --version 2>&1 | head -1)"
    fi
    echo "$CACHE/usr/bin/promtool"
    ;;
  *) echo "usage: $0 path" >&2; exit 2 ;;
esac
