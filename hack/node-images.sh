#!/usr/bin/env bash
# Stand-in container images for the real node, built on this machine from
# Debian's packages (no registry is reachable here), as OCI archives in a cache
# folder named after this recipe's hash: a changed recipe builds anew. Prints
# the folder. hack/cluster/images.sh imports them into the node's containerd.
#
#   pause.tar     the pod sandbox (hack/images/pause, a Go program of ours)
#   postgres.tar  postgres:15, :15.2, ...: Debian's postgresql-15, user postgres
#                 with uid 999, binaries on PATH (Keelson runs its own script)
#   nginx.tar     nginx:1.25-alpine, ...: Debian's nginx serving a welcome page on :80
#
# They are stand-ins, not the official images: their config carries the label
# dev.keelson.stand-in, and the node says which real versions they hold.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

CACHE_ROOT="${KEELSON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson}"
SUITE=bookworm
MIRROR="${KEELSON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The tags Keelson and its tests ask for; every one names the same image.
POSTGRES_TAGS=(15 15.2 15.3 15.4)
NGINX_TAGS=(1.25-alpine 1.25 1.26-alpine 1.26 1.27)
PAUSE_NAME=registry.k8s.io/pause:3.10

recipe_hash() {
  cat "${BASH_SOURCE[0]}" "$ROOT"/hack/images/oci.sh "$ROOT"/hack/images/nginx.conf "$ROOT"/hack/images/pause/* | sha256sum | cut -c1-12
}
OUT="$CACHE_ROOT/images-$SUITE-$(recipe_hash)"
BUILD="$CACHE_ROOT/build/images"

log() { printf '[node-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -f "$OUT/done" ]]; then echo "$OUT"; exit 0; fi
[[ $(id -u) -eq 0 ]] || die "building images needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || {
  log "installing debootstrap"
  apt-get install -y -qq debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
}
mkdir -p "$OUT" "$BUILD"
started=$SECONDS

# A minimal Debian root, made once and copied for each image.
base_rootfs() {
  local base="$BUILD/$SUITE-minbase"
  if [[ ! -f "$base.done" ]]; then
    rm -rf "$base"
    log "debootstrap $SUITE from $MIRROR (a few minutes, once)"
    debootstrap --variant=minbase "$SUITE" "$base" "$MIRROR" > "$BUILD/debootstrap.log" 2>&1 \
      || die "debootstrap failed; see $BUILD/debootstrap.log"
    touch "$base.done"
  fi
  echo "$base"
}

# in_chroot ROOTFS CMD: runs a shell command inside ROOTFS with /proc mounted.
in_chroot() {
  local rootfs="$1"; shift
  mount -t proc proc "$rootfs/proc"
  local rc=0
  chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    /bin/sh -euc "$*" >> "$BUILD/chroot.log" 2>&1 || rc=$?
  umount "$rootfs/proc"
  [[ $rc -eq 0 ]] || die "chroot step failed; see $BUILD/chroot.log"
}

# new_rootfs NAME: a fresh copy of the base with apt's caches dropped at the end.
new_rootfs() {
  local rootfs="$BUILD/$1"
  rm -rf "$rootfs"
  cp -a "$(base_rootfs)" "$rootfs"
  printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d" # no service starts at install
  chmod +x "$rootfs/usr/sbin/policy-rc.d"
  echo "$rootfs"
}

slim() { rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/locale/*; }

# shellcheck source=hack/images/oci.sh
source "$ROOT/hack/images/oci.sh"

labels() { # labels STAND_IN_FOR REAL_VERSION
  printf '{"dev.keelson.stand-in":"true","dev.keelson.stand-in.for":"%s","dev.keelson.real-version":"%s","org.opencontainers.image.description":"Keelson stand-in built from Debian %s packages, not the official image"}' \
    "$1" "$2" "$SUITE"
}

build_pause() {
  local rootfs="$BUILD/pause"
  rm -rf "$rootfs" && mkdir -p "$rootfs"
  (cd "$ROOT/hack/images/pause" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags '-s -w' -o "$rootfs/pause" .)
  oci_archive "$rootfs" "$OUT/pause.tar" \
    "{\"Entrypoint\":[\"/pause\"],\"Labels\":$(labels "$PAUSE_NAME" keelson)}" "$PAUSE_NAME"
}

build_postgres() {
  local rootfs; rootfs="$(new_rootfs postgres)"
  # uid/gid 999 as in the official image, made before the package makes its own.
  in_chroot "$rootfs" "groupadd -r -g 999 postgres && useradd -r -u 999 -g 999 -d /var/lib/postgresql -s /bin/bash postgres
    mkdir -p /etc/postgresql-common/createcluster.d
    echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/keelson.conf
    apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql-15 procps
    mkdir -p /var/run/postgresql /var/lib/postgresql/data
    chown -R 999:999 /var/run/postgresql /var/lib/postgresql && chmod 3777 /var/run/postgresql"
  local real; real="$(chroot "$rootfs" /usr/lib/postgresql/15/bin/postgres --version | awk '{print $3}')"
  slim "$rootfs"
  # Left out: JIT compilation (LLVM, 130 MB; PostgreSQL runs without it when
  # the provider is absent, and Keelson does not use it). With the message
  # translations gone too, half the size: the node imports it faster.
  rm -rf "$rootfs"/usr/lib/postgresql/15/lib/llvmjit* "$rootfs"/usr/lib/postgresql/15/lib/bitcode \
    "$rootfs"/usr/lib/x86_64-linux-gnu/libLLVM-* "$rootfs"/usr/lib/x86_64-linux-gnu/libz3.so*
  local names=() tag
  for tag in "${POSTGRES_TAGS[@]}" "$real"; do names+=("docker.io/library/postgres:$tag"); done
  oci_archive "$rootfs" "$OUT/postgres.tar" \
    "{\"Env\":[\"PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\",\"PGDATA=/var/lib/postgresql/data\",\"LANG=C.UTF-8\"],\"Cmd\":[\"postgres\"],\"User\":\"\",\"WorkingDir\":\"/\",\"Labels\":$(labels postgres "$real")}" \
    "${names[@]}"
  echo "postgres=$real" >> "$OUT/versions"
}

build_nginx() {
  local rootfs; rootfs="$(new_rootfs nginx)"
  in_chroot "$rootfs" "apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light"
  local real; real="$(chroot "$rootfs" /usr/sbin/nginx -v 2>&1 | sed 's|.*nginx/||; s| .*||')"
  install -m 0644 "$ROOT/hack/images/nginx.conf" "$rootfs/etc/nginx/nginx.conf"
  mkdir -p "$rootfs/usr/share/nginx/html"
  printf '<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to nginx!</h1>\n<p>Keelson stand-in: Debian %s nginx %s.</p></body></html>\n' \
    "$SUITE" "$real" > "$rootfs/usr/share/nginx/html/index.html"
  slim "$rootfs"
  local names=() tag
  for tag in "${NGINX_TAGS[@]}"; do names+=("docker.io/library/nginx:$tag"); done
  oci_archive "$rootfs" "$OUT/nginx.tar" \
    "{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\"Cmd\":[\"nginx\",\"-g\",\"daemon off;\"],\"ExposedPorts\":{\"80/tcp\":{}},\"StopSignal\":\"SIGQUIT\",\"Labels\":$(labels nginx "$real")}" \
    "${names[@]}"
  echo "nginx=$real" >> "$OUT/versions"
}

rm -f "$OUT/versions"
build_pause
build_postgres
build_nginx
touch "$OUT/done"
for old in "$CACHE_ROOT"/images-"$SUITE"-*; do [[ "$old" == "$OUT" ]] || rm -rf "$old"; done # older recipes
log "images built in $((SECONDS - started))s: $(tr '\n' ' ' < "$OUT/versions")($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
