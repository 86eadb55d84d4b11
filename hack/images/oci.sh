# Sourced by hack/node-images.sh and hack/cluster/images.sh: an OCI image
# archive written by hand (no container engine here), for `ctr images import`.

sha() { sha256sum "$1" | cut -d' ' -f1; }

# oci_archive ROOTFS OUTPUT CONFIG_JSON NAME...: one layer from ROOTFS, one
# image config, every NAME pointing at the same manifest.
oci_archive() {
  local rootfs="$1" output="$2" config="$3"; shift 3
  local work; work="$(mktemp -d "${BUILD:-${TMPDIR:-/tmp}}/oci.XXXXXX")"
  mkdir -p "$work/blobs/sha256"
  tar --numeric-owner --xattrs -C "$rootfs" --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* \
    -cf "$work/layer.tar" .
  local layer layer_size
  layer="$(sha "$work/layer.tar")"; layer_size="$(stat -c %s "$work/layer.tar")"
  mv "$work/layer.tar" "$work/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$config" "$layer" > "$work/config.json"
  local cfg cfg_size
  cfg="$(sha "$work/config.json")"; cfg_size="$(stat -c %s "$work/config.json")"
  mv "$work/config.json" "$work/blobs/sha256/$cfg"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg" "$cfg_size" "$layer" "$layer_size" > "$work/manifest.json"
  local manifest manifest_size
  manifest="$(sha "$work/manifest.json")"; manifest_size="$(stat -c %s "$work/manifest.json")"
  mv "$work/manifest.json" "$work/blobs/sha256/$manifest"
  local entries="" name
  for name in "$@"; do
    entries+="${entries:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest\",\"size\":$manifest_size,\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}"
  done
  printf '{"schemaVersion":2,"manifests":[%s]}' "$entries" > "$work/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$work/oci-layout"
  tar -C "$work" -cf "$output.tmp" oci-layout index.json blobs && mv "$output.tmp" "$output"
  rm -rf "$work"
}
