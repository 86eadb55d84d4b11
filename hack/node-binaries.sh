#!/usr/bin/env bash
# Provides the binaries of the real node of the local cluster: kubelet
# and kube-proxy of the control plane's Kubernetes release, and CoreDNS, built
# from the Go module proxy into a cache outside the work tree; prints the folder.
# hack/cluster.sh calls it when it starts the real node (a cold build takes
# 25-40 min on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

K8S_VERSION="${KEELSON_K8S_VERSION:-v1.36.3}"
COREDNS_VERSION="${KEELSON_COREDNS_VERSION:-v1.15.0}"
BINARIES=(kubelet kube-proxy coredns)
CACHE_ROOT="${KEELSON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson}"
BIN_DIR="$CACHE_ROOT/node-$K8S_VERSION-coredns-$COREDNS_VERSION/bin"
BUILD_ROOT="$CACHE_ROOT/build"

# shellcheck source=hack/lib/go-build.sh
source "$ROOT/hack/lib/go-build.sh"

log() { printf '[node-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

has_all() { local b; for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done; }
if has_all; then echo "$BIN_DIR"; exit 0; fi

command -v go >/dev/null || die "no Go toolchain on PATH"
mkdir -p "$BIN_DIR" "$BUILD_ROOT"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

# The control plane's wrapper module (its go.mod pins every staging module of
# the release) builds the node binaries too, so they match it exactly.
build_kubernetes_node() {
  "$ROOT/hack/k8s-binaries.sh" >/dev/null
  local ver="$K8S_VERSION" w
  w="$BUILD_ROOT/kubernetes-$ver"
  [[ -f "$w/go.mod" ]] || die "no wrapper module in $w (hack/k8s-binaries.sh builds it)"
  cd "$w"
  local pkgs=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  go get "${pkgs[@]/%/@$ver}" >&2
  go build -trimpath -ldflags "$(k8s_ldflags "$ver")" -o "$BIN_DIR/" "${pkgs[@]}"
}

build_coredns() {
  go_build_module "$BUILD_ROOT/coredns-$COREDNS_VERSION" github.com/coredns/coredns "$COREDNS_VERSION" "$BIN_DIR/coredns"
}

start=$SECONDS
[[ -x "$BIN_DIR/kubelet" && -x "$BIN_DIR/kube-proxy" ]] || build_kubernetes_node
log "kubelet and kube-proxy built after $((SECONDS - start))s"
[[ -x "$BIN_DIR/coredns" ]] || build_coredns
has_all || die "build finished but binaries are missing in $BIN_DIR"
log "built in $((SECONDS - start))s: $("$BIN_DIR/kubelet" --version), $("$BIN_DIR/coredns" -version | head -1)"
echo "$BIN_DIR"
