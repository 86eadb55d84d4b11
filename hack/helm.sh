#!/usr/bin/env bash
# Provides helm (for the chart's render test), built from the Go module proxy
# into the cache outside the work tree; prints its path.
set -euo pipefail
HELM_VERSION="${KEELSON_HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${KEELSON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson}"
BIN="$CACHE_ROOT/helm-$HELM_VERSION/bin"
if [[ -x "$BIN/helm" ]]; then echo "$BIN/helm"; exit 0; fi
command -v go >/dev/null || { echo "helm: no Go toolchain to build it" >&2; exit 1; }
echo "[helm] building helm $HELM_VERSION (about 2 minutes)" >&2
mkdir -p "$BIN"
GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
echo "$BIN/helm"
