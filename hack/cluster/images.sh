# Sourced by hack/cluster.sh: the stand-in images (hack/node-images.sh builds
# them from Debian's packages) imported into the node's containerd, once per
# build; the node's annotation says which real versions stand in.

start_images() {
  local dir archive marker
  dir="$("$ROOT/hack/node-images.sh")"
  for archive in "$dir"/*.tar; do
    marker="$DIR/containerd/root/keelson-imported-$(basename "$dir")-$(basename "$archive" .tar)"
    [[ -f "$marker" ]] && continue
    log "importing $(basename "$archive") into the node's containerd"
    ctr_node images import "$archive" >> "$DIR/images.log" 2>&1 || die "cannot import $archive; see $DIR/images.log"
    touch "$marker"
  done
  STAND_INS="$(sed 's/^postgres=/postgres: Debian postgresql-15 /; s/^nginx=/nginx: Debian nginx /' "$dir/versions" | paste -sd ';')"
}

healthy_images() {
  local names; names="$(ctr_node images ls -q)"
  grep -qx registry.k8s.io/pause:3.10 <<<"$names" && grep -qx docker.io/library/postgres:15.2 <<<"$names" \
    && grep -qx docker.io/library/nginx:1.25-alpine <<<"$names"
}
