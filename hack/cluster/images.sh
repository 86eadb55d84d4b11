# Sourced by hack/cluster.sh: the stand-in images (hack/node-images.sh builds
# them from Debian's packages) imported into each node's containerd, once per
# build; the nodes' annotation says which real versions stand in.

start_images() {
  local dir archive marker
  dir="$("$ROOT/hack/node-images.sh")"
  # The nodes import side by side (a fresh cluster folder: ~8 s for each).
  local k pids=()
  for k in $(node_numbers); do
    node "$k"
    # The markers say what was imported once; the kubelet's image GC (disk pressure) may have
    # removed it since: then everything is imported again.
    healthy_node_images || rm -f "$NODE_DIR/containerd/root/keelson-imported-"*
    (
      for archive in "$dir"/*.tar; do
        marker="$NODE_DIR/containerd/root/keelson-imported-$(basename "$dir")-$(basename "$archive" .tar)"
        [[ -f "$marker" ]] && continue
        log "importing $(basename "$archive") into $NODE_NAME's containerd"
        ctr_node images import "$archive" >> "$DIR/images-$k.log" 2>&1 || die "cannot import $archive into $NODE_NAME; see $DIR/images-$k.log"
        touch "$marker"
      done
    ) &
    pids+=("$!")
  done
  for k in "${pids[@]}"; do wait "$k" || die "the images could not be imported"; done
  STAND_INS="$(sed 's/^postgres=/postgres: Debian postgresql-15 /; s/^nginx=/nginx: Debian nginx /' "$dir/versions" | paste -sd ';')"
}

healthy_images() {
  local k
  for k in $(node_numbers); do node "$k"; healthy_node_images || return 1; done
}

healthy_node_images() {
  local names
  names="$(ctr_node images ls -q)"
  grep -qx registry.k8s.io/pause:3.10 <<<"$names" && grep -qx docker.io/library/postgres:15.2 <<<"$names" \
    && grep -qx docker.io/library/nginx:1.25-alpine <<<"$names"
}

# keelson_image BINARY: the operator's image made from BINARY (one file,
# /keelson) and imported into every node's containerd; prints its reference,
# tagged with the binary's hash so that a rebuilt binary is a new image.
# MyDatabase pods copy the instance manager from it (an init container).
# Without a real node (kwok profile) nothing runs it: only the name is printed.
keelson_image() {
  local binary="$1" ref="${2:-}" hash work full marker
  [[ -x "$binary" ]] || die "no executable $binary (cargo build --bin keelson)"
  hash="$(sha256sum "$binary" | cut -c1-12)"
  ref="${ref:-keelson:dev-$hash}"
  # containerd's full name: docker.io/library/keelson:x, registry.example.com/team/keelson:x.
  case "${ref%%/*}" in
    "$ref") full="docker.io/library/$ref" ;;
    *.* | *:* | localhost) full="$ref" ;;
    *) full="docker.io/$ref" ;;
  esac
  marker="keelson-image-$hash-$(printf '%s' "$full" | sha256sum | cut -c1-8)"
  [[ "$(profile)" == kwok ]] && { echo "$ref"; return; }
  local k missing=()
  for k in $(powered_nodes); do
    node "$k"
    # The marker, and the image itself: the kubelet's image GC may have removed it since.
    [[ -f "$NODE_DIR/containerd/root/$marker" ]] && ctr_node images ls -q 2>/dev/null | grep -qx "$full" || missing+=("$k")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    work="$(mktemp -d)"
    mkdir "$work/rootfs"
    # Debug symbols are of no use in a pod and are most of a debug build's size.
    objcopy --strip-debug "$binary" "$work/rootfs/keelson" && chmod 0755 "$work/rootfs/keelson"
    # A cargo build links glibc dynamically (the release image is a static musl
    # build): its loader and libraries come along, from this Debian.
    local lib
    for lib in $(ldd "$binary" | grep -oE '/[^ ]+'); do
      mkdir -p "$work/rootfs$(dirname "$lib")" && cp -L "$lib" "$work/rootfs$lib"
    done
    # shellcheck source=hack/images/oci.sh
    source "$ROOT/hack/images/oci.sh"
    BUILD="$work" oci_archive "$work/rootfs" "$work/keelson.tar" \
      '{"Entrypoint":["/keelson"],"User":"65532","Labels":{"org.opencontainers.image.description":"Keelson, built on this machine"}}' \
      "$full"
    for k in "${missing[@]}"; do
      node "$k"
      ctr_node images import "$work/keelson.tar" >> "$DIR/images.log" 2>&1 || die "cannot import $ref into $NODE_NAME; see $DIR/images.log"
      touch "$NODE_DIR/containerd/root/$marker"
    done
    rm -rf "$work"
  fi
  prune_keelson_images "$hash"
  echo "$ref"
}

# prune_keelson_images HASH: the images of other builds of keelson that tests
# made (`keelson:dev-<hash>` and its suffixed names; a demo's and a user's
# tags stay) leave the nodes, with their markers; containerd then collects
# their layers. Each is a debug binary: without this, every build kept
# hundreds of MB per node for good.
prune_keelson_images() {
  local hash="$1" k old orphans
  for k in $(powered_nodes); do
    node "$k"
    old="$(ctr_node images ls -q 2>/dev/null | grep -E '^docker\.io/library/keelson:dev-[0-9a-f]{12}' \
      | grep -vE "^docker\.io/library/keelson:dev-$hash" || true)"
    # shellcheck disable=SC2086 # one name per word
    [[ -z "$old" ]] || ctr_node images rm $old >> "$DIR/images.log" 2>&1 || true
    # The kubelet's runtime also names each image by its ID (sha256:...): such a name whose image
    # no tag names any more would keep the layers.
    orphans="$(ctr_node images ls 2>/dev/null | awk 'NR > 1 && $1 !~ /^sha256:/ {tagged[$3] = 1}
      NR > 1 && $1 ~ /^sha256:/ {id[$1] = $3} END {for (i in id) if (!(id[i] in tagged)) print i}')"
    # shellcheck disable=SC2086 # one name per word
    [[ -z "$orphans" ]] || ctr_node images rm --sync $orphans >> "$DIR/images.log" 2>&1 || true
    find "$NODE_DIR/containerd/root" -maxdepth 1 -name 'keelson-image-*' ! -name "keelson-image-$hash-*" -delete
  done
}
