#!/usr/bin/env bash
# Provides etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl and kwok of pinned versions, and prints the folder that holds them.
#
# Lookup order: $KEELSON_K8S_BIN (prebuilt binaries), then the cache outside
# the work tree, then a build from the Go module proxy into that cache.
# Progress goes to stderr; the folder alone goes to stdout.
set -euo pipefail

K8S_VERSION="${KEELSON_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${KEELSON_ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KEELSON_KWOK_VERSION:-v0.8.0}"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

CACHE_ROOT="${KEELSON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION/bin"
BUILD_ROOT="$CACHE_ROOT/build"

# shellcheck source=hack/lib/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-build.sh"

log() { printf '[k8s-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

has_all() {
  local dir="$1" b
  for b in "${BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
  [[ -f "$dir/kwok-stages.yaml" ]]
}

if [[ -n "${KEELSON_K8S_BIN:-}" ]]; then
  has_all "$KEELSON_K8S_BIN" || die "KEELSON_K8S_BIN=$KEELSON_K8S_BIN lacks one of: ${BINARIES[*]} kwok-stages.yaml"
  echo "$KEELSON_K8S_BIN"
  exit 0
fi
if has_all "$BIN_DIR"; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || die "no Go toolchain on PATH: install Go >= 1.26, or set KEELSON_K8S_BIN to a folder of prebuilt binaries"
mkdir -p "$BIN_DIR" "$BUILD_ROOT"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
TIMINGS=()

# Runs a build step, streaming a heartbeat so a long compile shows progress.
timed() {
  local name="$1"; shift
  local start=$SECONDS
  log "start: $name"
  ( while sleep 30; do log "... $name still running ($((SECONDS - start))s)"; done ) &
  local beat=$!
  local rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  TIMINGS+=("$name: $((SECONDS - start))s")
  [[ $rc -eq 0 ]] || die "$name failed (exit $rc)"
  log "done: $name in $((SECONDS - start))s"
}

build_kubernetes() {
  local ver="$K8S_VERSION" staging_ver w gomod
  staging_ver="v0.${ver#v1.}"
  w="$BUILD_ROOT/kubernetes-$ver"
  rm -rf "$w" && mkdir -p "$w" && cd "$w"
  gomod="$(go mod download -json "k8s.io/kubernetes@$ver" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$gomod" ]] || die "could not download the go.mod of k8s.io/kubernetes@$ver"
  {
    echo "module keelson.local/k8s-build"
    echo
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug ' "$gomod" || true
    echo
    # Every staging module k8s.io/kubernetes replaces with ./staging/src/...
    # is pinned to the published module of the same release instead.
    grep -E '=> \./staging/src/' "$gomod" | awk -v v="$staging_ver" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  log "wrapper module: $(grep -c '^replace' go.mod) staging replaces derived from k8s.io/kubernetes@$ver go.mod"
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  # Naming each package at the pinned version also records go.sum entries for
  # everything they import.
  go get "${pkgs[@]/%/@$ver}" >&2
  go build -trimpath -ldflags "$(k8s_ldflags "$ver")" -o "$BIN_DIR/" "${pkgs[@]}"
}

build_etcd() {
  go_build_module "$BUILD_ROOT/etcd-$ETCD_VERSION" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$BIN_DIR/etcd"
}

build_kwok() {
  GOBIN="$BIN_DIR" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

# kwok needs Stage objects that say how nodes and pods evolve; the module
# ships them. Nodes: initialize + heartbeat; pods: ready, complete (Job pods), delete.
kwok_stages() {
  local dir
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -d "$dir/kustomize/stage" ]] || die "kwok module has no kustomize/stage folder"
  local f
  for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    printf -- "---\n"
    cat "$dir/kustomize/stage/$f"; echo
  done > "$BIN_DIR/kwok-stages.yaml.tmp"
  mv "$BIN_DIR/kwok-stages.yaml.tmp" "$BIN_DIR/kwok-stages.yaml"
}

log "building into $BIN_DIR (cold builds take 15-30 min on 2 cores)"
[[ -x "$BIN_DIR/etcd" ]] || timed "etcd $ETCD_VERSION" build_etcd
[[ -x "$BIN_DIR/kwok" ]] || timed "kwok $KWOK_VERSION" build_kwok
[[ -x "$BIN_DIR/kube-apiserver" && -x "$BIN_DIR/kubectl" && -x "$BIN_DIR/kube-scheduler" && -x "$BIN_DIR/kube-controller-manager" ]] \
  || timed "kubernetes $K8S_VERSION" build_kubernetes
[[ -f "$BIN_DIR/kwok-stages.yaml" ]] || timed "kwok stages" kwok_stages
has_all "$BIN_DIR" || die "build finished but binaries are missing in $BIN_DIR"
log "kube-apiserver reports: $("$BIN_DIR/kube-apiserver" --version)"
log "timings: ${TIMINGS[*]:-none (all cached)}"
echo "$BIN_DIR"
