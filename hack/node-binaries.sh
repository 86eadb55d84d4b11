#!/usr/bin/env bash
# Provides the binaries of the real node of the local cluster: kubelet
# and kube-proxy of the control plane's Kubernetes release, CoreDNS, and
# kube-router (its NetworkPolicy firewall only), built from the Go module proxy
# into a cache outside the work tree; prints the folder.
# hack/cluster.sh calls it when it starts the real node (a cold build takes
# 25-40 min on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

K8S_VERSION="${KEELSON_K8S_VERSION:-v1.36.3}"
COREDNS_VERSION="${KEELSON_COREDNS_VERSION:-v1.15.0}"
# The NetworkPolicy engine. SIG Network's kube-network-policies needs the
# kernel's nft_queue, which this machine's kernel lacks; kube-router's firewall
# uses iptables and ipset. The newest release the module proxy serves is
# v2.1.0, whose golang.org/x dependencies have known flaws: they are raised
# to the newest served on 2026-12-06 (kube-router's own code is unchanged).
KUBE_ROUTER_VERSION="${KEELSON_KUBE_ROUTER_VERSION:-v2.1.0}"
BINARIES=(kubelet kube-proxy coredns kube-router)
CACHE_ROOT="${KEELSON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson}"
BIN_DIR="$CACHE_ROOT/node-$K8S_VERSION-coredns-$COREDNS_VERSION/bin"
BUILD_ROOT="$CACHE_ROOT/build"

# shellcheck source=hack/lib/go-build.sh
source "$ROOT/hack/lib/go-build.sh"

log() { printf '[node-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

has_all() {
  local b; for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
  kube_router_current
}
kube_router_current() { [[ "$(cat "$BIN_DIR/kube-router.version" 2>/dev/null)" == "$KUBE_ROUTER_VERSION" ]]; }
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

build_kube_router() {
  local dir="$BUILD_ROOT/kube-router-$KUBE_ROUTER_VERSION" module=github.com/cloudnativelabs/kube-router/v2
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  printf 'module keelson.local/kube-router\n\ngo 1.26.0\n' > go.mod
  go get "$module/cmd/kube-router@$KUBE_ROUTER_VERSION" >&2
  go get golang.org/x/net@v0.63.0 golang.org/x/crypto@v0.59.0 golang.org/x/sys@v0.50.0 golang.org/x/text@v0.44.0 >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/kube-router" "$module/cmd/kube-router"
  echo "$KUBE_ROUTER_VERSION" > "$BIN_DIR/kube-router.version"
}

start=$SECONDS
[[ -x "$BIN_DIR/kubelet" && -x "$BIN_DIR/kube-proxy" ]] || build_kubernetes_node
log "kubelet and kube-proxy built after $((SECONDS - start))s"
[[ -x "$BIN_DIR/coredns" ]] || build_coredns
kube_router_current || build_kube_router
has_all || die "build finished but binaries are missing in $BIN_DIR"
log "built in $((SECONDS - start))s: $("$BIN_DIR/kubelet" --version), $("$BIN_DIR/coredns" -version | head -1)"
echo "$BIN_DIR"
