# Sourced by hack/cluster.sh: each real node's container runtime, Debian's
# containerd and runc with the CNI plugins, installed when missing, run in the
# node's network namespace (its CNI bridge and pods' links are made there).
# Its root (images, snapshots) is the node's disk, its state and socket are
# under the node's /run. It can never pull: every registry, docker.io included, resolves to a
# closed port on loopback, so an image that was not built here fails at once
# (ErrImagePull) instead of reaching out.

NODE_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack ipset)

install_node_packages() {
  local missing=() p
  for p in "${NODE_PACKAGES[@]}"; do dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [[ ${#missing[@]} -eq 0 ]] && return
  log "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } \
    || die "cannot install ${missing[*]}"
}

CONTAINERD_SOCK() { echo "$NODE_RUN/containerd.sock"; }

start_containerd() {
  install_node_packages
  local k; for k in $(node_numbers); do node "$k"; start_node_containerd; done
}

start_node_containerd() {
  local c="$NODE_DIR/containerd"
  mkdir -p "$c/certs.d/_default" "$c/certs.d/docker.io" "$NODE_RUN"
  local d; for d in _default docker.io; do
    printf 'server = "http://127.0.0.1:9"\n[host."http://127.0.0.1:9"]\n  capabilities = ["pull", "resolve"]\n' \
      > "$c/certs.d/$d/hosts.toml"
  done
  cat > "$c/config.toml" <<TOML
version = 2
root = "$c/root"
state = "$NODE_RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$(CONTAINERD_SOCK)"
[ttrpc]
  address = "$NODE_RUN/containerd.ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$c/certs.d"
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
TOML
  # Pulls that escape the mirror configuration go to a closed proxy.
  HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY='' \
    start_program "containerd-$NODE_K" "${IN_NODE[@]}" /usr/bin/containerd --config "$c/config.toml"
}

ctr_node() { ctr --address "$(CONTAINERD_SOCK)" --namespace k8s.io "$@"; }

healthy_containerd() { local k; for k in $(node_numbers); do node "$k"; ctr_node version || return 1; done; }

kill_shims() { # the runtime shims of node NODE_K's containerd: their -address is its socket
  local proc
  for proc in /proc/[0-9]*; do
    if tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | grep -q -- "-address $(CONTAINERD_SOCK) "; then
      kill -9 "${proc#/proc/}" 2>/dev/null || true
    fi
  done
}

stop_containerd() { local k; for k in $(node_numbers); do node "$k"; stop_pid "containerd-$k"; kill_shims; done; }
