#!/usr/bin/env bash
# A local Kubernetes cluster: the control plane on loopback (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler), KWOK's fake nodes
# for scale, and three real nodes, keelson-node-1..3, each a network namespace
# of its own with its containerd, kubelet, kube-proxy and NetworkPolicy engine
# (kube-router's firewall), a pod subnet and a
# zone, where pods run real containers from images built on this machine
# (CoreDNS and the API bridge serve them from this host, behind a fence).
# Volumes come from keelson-local-volumes.
#
#   hack/cluster.sh up             start it (idempotent); returns once it is ready
#   hack/cluster.sh down           stop what `up` started (by pid) and undo its
#                                  mounts, bridge, iptables rules and sysctls
#   hack/cluster.sh status         say whether it is up
#   hack/cluster.sh leftovers      after `down`: list any process, mount, bridge,
#                                  rule, cgroup or folder it left; fails if any
#   hack/cluster.sh stop NAME      stop one component (failure tests)
#   hack/cluster.sh start NAME     start it again and wait until it is healthy
#   hack/cluster.sh restart NAME
#   hack/cluster.sh keelson-image BINARY [REF]   the operator's image from BINARY (named
#                                  REF, default keelson:dev-<hash>), imported into the
#                                  nodes (the operator, MyDatabase pods' instance manager);
#                                  prints its reference
#
# Node faults (NODE is keelson-node-K or K; each returns once it is in place):
#   hack/cluster.sh partition NODE  cut the node's network: kubelet, kube-proxy and
#                                  pods lose every path off the node, processes run on
#   hack/cluster.sh heal NODE       plug it back in
#   hack/cluster.sh poweroff NODE   stop it as a power cut would: pods frozen, then
#                                  everything on it killed, its /run and kernel state
#                                  (network namespace, mounts, cgroups) gone, disks kept;
#                                  nothing is cleaned up in the API
#   hack/cluster.sh poweron NODE    boot it again; returns once it is Ready
#   hack/cluster.sh drain NODE      kubectl drain (evictions, PDBs respected); uncordon NODE
#
# KEELSON_REAL_NODES (1-3, default 3) chooses how many real nodes `up` starts.
#
# KEELSON_CLUSTER_PROFILE=kwok leaves the real node out (the benchmark's
# cluster): KWOK's nodes then take every pod. With the real node, KWOK's nodes
# are tainted and take only the pods of namespaces annotated for them
# (hack/cluster/kwok.sh).
#
# One file per component in hack/cluster/, each with `start_<name>`,
# `healthy_<name>` and, where stopping is more than a signal to its pid,
# `stop_<name>`. State, logs and the admin kubeconfig live in
# $KEELSON_CLUSTER_DIR (default target/dev-cluster). Ports come from
# $KEELSON_CLUSTER_PORT_BASE, else from a hash of that folder's path (within
# 10000-19999, outside the ephemeral range), moved on
# while any is taken; the node's bridge and subnet from the same hash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${KEELSON_CLUSTER_DIR:-$ROOT/target/dev-cluster}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
NODES="${KEELSON_CLUSTER_NODES:-3}"
# The machine-wide claim of the one cluster with real nodes a machine can hold
# (the host's kube-proxy rules are not per cluster).
NODE_OWNER=/run/keelson-node.owner

PARTS=(lib pki etcd kube-apiserver kube-controller-manager kube-scheduler kwok network api-bridge containerd images kubelet kube-proxy coredns network-policies storage)
for part in "${PARTS[@]}"; do
  # shellcheck source=/dev/null
  source "$ROOT/hack/cluster/$part.sh"
done
node_settings

# Components in start order, and the processes among them (pid files).
profile() { cat "$DIR/profile" 2>/dev/null || echo "${KEELSON_CLUSTER_PROFILE:-node}"; }
components() {
  echo etcd kube-apiserver kube-controller-manager kube-scheduler kwok
  [[ "$(profile)" == kwok ]] || echo network api-bridge containerd images kubelet kube-proxy coredns network-policies
  echo storage
}
# Of the real nodes, those not powered off (hack/cluster.sh poweroff).
powered_nodes() { local k; for k in $(node_numbers); do [[ -f "$DIR/nodes/$k/powered-off" ]] || echo "$k"; done; }
processes() {
  echo etcd kube-apiserver kube-controller-manager kube-scheduler kwok
  if [[ "$(profile)" != kwok ]]; then
    echo api-bridge kube-proxy coredns
    local k; for k in $(powered_nodes); do echo "containerd-$k kubelet-$k kube-proxy-$k network-policies-$k"; done
  fi
  echo local-volumes
}

fn() { echo "${1//-/_}"; } # component name → the suffix of its functions

# start_component NAME: starts it and waits until it is healthy.
start_component() {
  components | tr ' ' '\n' | grep -qx "$1" || die "unknown component $1 (one of: $(components | tr '\n' ' '))"
  log "starting $1"
  "start_$(fn "$1")"
  wait_until 120 "$1 to be healthy" "healthy_$(fn "$1")"
}

stop_component() {
  if declare -F "stop_$(fn "$1")" >/dev/null; then "stop_$(fn "$1")"
  elif [[ "$1" == storage ]]; then stop_pid local-volumes
  else stop_pid "$1"; fi
}

all_alive() { local p; for p in $(processes); do pid_alive "$p" || return 1; done; }

usage() {
  cat >&2 <<USAGE
Keelson dev cluster ($(profile) profile): Kubernetes $("$BIN/kube-apiserver" --version | cut -d' ' -f2), API server https://127.0.0.1:$API_PORT
  source $DIR/env        # sets KUBECONFIG and puts this cluster's kubectl first on PATH
  kubectl get nodes
  make cluster-down      # stops it (logs stay in $DIR)
USAGE
}

binaries() {
  BIN="$("$ROOT/hack/k8s-binaries.sh")"
  [[ "$(profile)" == kwok ]] || NODE_BIN="$("$ROOT/hack/node-binaries.sh")"
}

# The cluster folder whose real node runs on this machine, if not ours.
other_node_owner() {
  local owner
  owner="$(cat "$NODE_OWNER" 2>/dev/null || true)"
  [[ -n "$owner" && "$owner" != "$DIR" && -f "$owner/api-bridge.pid" ]] && kill -0 "$(cat "$owner/api-bridge.pid")" 2>/dev/null \
    && echo "$owner"
}

claim_node() {
  [[ "${KEELSON_CLUSTER_PROFILE:-node}" == kwok ]] && return
  [[ $(id -u) -eq 0 ]] || die "the real node needs root (bridge, iptables, mounts); or use KEELSON_CLUSTER_PROFILE=kwok"
  local owner
  owner="$(other_node_owner || true)"
  [[ -z "$owner" ]] || die "the real nodes of another cluster ($owner) run on this machine; stop it first (hack/cluster.sh down with KEELSON_CLUSTER_DIR=$owner), or start this one with KEELSON_CLUSTER_PROFILE=kwok"
  echo "$DIR" > "$NODE_OWNER"
}

up() {
  if [[ -f "$DIR/ports" ]] && all_alive; then
    binaries
    # shellcheck disable=SC1091
    source "$DIR/ports"
    if healthy_kube_apiserver; then
      log "already up (API server https://127.0.0.1:$API_PORT)"
      usage
      return
    fi
  fi
  claim_node
  down_quietly
  echo "${KEELSON_CLUSTER_PROFILE:-node}" > "$DIR/profile"
  echo "$REAL_NODES" > "$DIR/real-nodes"
  rm -f "$DIR"/nodes/*/powered-off
  binaries
  local started=$SECONDS c
  pick_ports
  # shellcheck disable=SC1091
  source "$DIR/ports"
  make_pki
  write_kubeconfig
  KWOK_TAINTS="" # beside a real node, KWOK's nodes take only the pods that ask for them
  [[ "$(profile)" == kwok ]] || KWOK_TAINTS="{key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}"
  for c in $(components); do start_component "$c"; done
  all_alive || die "a component stopped after it started; see the logs in $DIR"
  log "cluster up in $((SECONDS - started))s"
  usage
}

# Undoes the real nodes: their processes, the pods' processes, the mounts
# under the cluster's folders, the network and the nodes' cgroups.
down_node() {
  local owner k
  owner="$(other_node_owner || true)"
  if [[ -n "$owner" ]]; then log "the real nodes on this machine are $owner's; leaving them alone"; return 0; fi
  stop_pid coredns kube-proxy api-bridge
  for k in $(node_numbers); do node "$k"; power_off_node; done
  unmount_under "$DIR" "$RUN"
  stop_network
  remove_kubernetes_chains
  # The runtimes' roots (imported images) stay for the next `up`.
  rm -rf "$RUN" "$DIR"/nodes/*/kubelet/root "$DIR"/nodes/*/powered-off "$DIR/volumes"
  [[ "$(cat "$NODE_OWNER" 2>/dev/null)" == "$DIR" ]] && rm -f "$NODE_OWNER"
  return 0
}

# power_off_node: node NODE_K stops at once. Its link goes down and its pods
# are frozen first, so nothing more leaves it or runs in it; then its
# kubelet, kube-proxy, containerd, shims and pods are killed, and what a
# reboot loses goes: the node's /run, its mounts, network namespace and
# cgroups. Its disk (runtime root, kubelet root, volumes) stays.
power_off_node() {
  ip link set "$VETH" down 2>/dev/null || true
  local freezer="/sys/fs/cgroup/freezer/$CGROUP_ROOT"
  [[ -d "$freezer" ]] && echo FROZEN > "$freezer/freezer.state" 2>/dev/null
  local name pids=()
  for name in "kubelet-$NODE_K" "kube-proxy-$NODE_K" "network-policies-$NODE_K" "containerd-$NODE_K"; do
    [[ -f "$DIR/$name.pid" ]] && pids+=("$(cat "$DIR/$name.pid")")
    rm -f "$DIR/$name.pid"
  done
  [[ ${#pids[@]} -eq 0 ]] || kill -9 "${pids[@]}" 2>/dev/null || true
  kill_shims
  kill_cgroup_processes "$CGROUP_ROOT" # signals reach frozen processes when they thaw
  [[ -d "$freezer" ]] && echo THAWED > "$freezer/freezer.state" 2>/dev/null
  kill_cgroup_processes "$CGROUP_ROOT"
  unmount_under "$NODE_RUN" "$NODE_DIR"
  stop_node_network
  remove_cgroups "$CGROUP_ROOT"
  rm -rf "$NODE_RUN"
  return 0
}

down_quietly() {
  stop_pid local-volumes kwok kube-scheduler kube-controller-manager
  # The node's leftovers are undone even if its processes are gone already.
  if [[ "$(profile)" != kwok && ( -f "$DIR/api-bridge.pid" || -d "$RUN" || -d "$DIR/network" ) ]]; then down_node; fi
  stop_pid kube-apiserver
  stop_pid etcd
  rm -rf "$DIR/etcd" "$DIR/volumes"
}

down() {
  down_quietly
  log "cluster stopped (logs kept in $DIR)"
}

with_running_cluster() {
  binaries
  [[ -f "$DIR/ports" ]] || die "no cluster in $DIR"
  # shellcheck disable=SC1091
  source "$DIR/ports"
}

stop_one() {
  with_running_cluster
  components | tr ' ' '\n' | grep -qx "$1" || die "unknown component $1 (one of: $(components | tr '\n' ' '))"
  stop_component "$1"
  log "stopped $1"
}

start_one() {
  with_running_cluster
  start_component "$1"
  log "started $1"
}

status() {
  if [[ -f "$DIR/ports" ]] && all_alive; then
    # shellcheck disable=SC1091
    source "$DIR/ports"
    healthy_kube_apiserver && { echo "up ($(profile) profile): https://127.0.0.1:$API_PORT"; return 0; }
  fi
  echo "down"; return 1
}

# leftovers: what `down` must not leave behind; prints it and fails if any.
leftovers() {
  local found=0 proc
  for proc in /proc/[0-9]*; do
    if tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | grep -qE -- "($DIR|$RUN)/"; then
      echo "process ${proc#/proc/}: $(tr '\0' ' ' < "$proc/cmdline" | cut -c1-120)"; found=1
    fi
  done
  if awk -v d="$DIR/" -v r="$RUN/" 'index($5, d) == 1 || index($5, r) == 1 {print "mount " $5; f=1} END {exit !f}' /proc/self/mountinfo; then found=1; fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then echo "bridge $BRIDGE"; found=1; fi
  if { iptables-save; ip6tables-save; } 2>/dev/null | grep -E "^:($FENCE-|KUBE-)"; then found=1; fi
  if compgen -G "/sys/fs/cgroup/*/$CGROUP_PREFIX*" >/dev/null; then echo "cgroups: $(compgen -G "/sys/fs/cgroup/*/$CGROUP_PREFIX*" | head -3)"; found=1; fi
  if ip netns list 2>/dev/null | grep -E "^keelson$CLUSTER_ID-n"; then found=1; fi
  if ip -o link show 2>/dev/null | grep -oE " kl${CLUSTER_ID}n[0-9]+"; then found=1; fi
  if ip route show 2>/dev/null | grep -F "$CLUSTER_POD_CIDR"; then found=1; fi
  if [[ -e "$RUN" ]]; then echo "runtime folder $RUN"; found=1; fi
  [[ $found -eq 0 ]] && echo "nothing left behind"
  return "$found"
}

# The node faults. Each acts on one real node and returns once the fault is
# in place (docs/local-cluster.md).
with_real_node() {
  with_running_cluster
  [[ "$(profile)" != kwok ]] || die "the kwok profile has no real nodes"
  node "$(node_of "${1:?node (keelson-node-K or K)}")"
}

partition() {
  with_real_node "$1"
  [[ ! -f "$NODE_DIR/powered-off" ]] || die "$NODE_NAME is powered off"
  ip link set "$VETH" down
  touch "$NODE_DIR/partitioned"
  log "$NODE_NAME partitioned: its kubelet, kube-proxy and pods reach nothing off the node"
}

heal() {
  with_real_node "$1"
  [[ ! -f "$NODE_DIR/powered-off" ]] || die "$NODE_NAME is powered off (hack/cluster.sh poweron $NODE_NAME)"
  ip link set "$VETH" up
  rm -f "$NODE_DIR/partitioned"
  wait_until 60 "$NODE_NAME's kubelet to answer over its link" curl -sf "http://$NODE_IP:$KUBELET_HEALTH_PORT/healthz"
  log "$NODE_NAME healed"
}

poweroff() {
  with_real_node "$1"
  [[ ! -f "$NODE_DIR/powered-off" ]] || { log "$NODE_NAME is off already"; return 0; }
  touch "$NODE_DIR/powered-off"
  power_off_node
  rm -f "$NODE_DIR/partitioned"
  log "$NODE_NAME powered off (disks kept in $NODE_DIR and $DIR/volumes)"
}

poweron() {
  with_real_node "$1"
  [[ -f "$NODE_DIR/powered-off" ]] || { log "$NODE_NAME is on already"; return 0; }
  local k="$NODE_K" since
  since="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
  start_node_network
  start_node_containerd
  wait_until 60 "$NODE_NAME's containerd" ctr_node version
  node "$k"; start_node_kubelet
  node "$k"; start_node_kube_proxy
  node "$k"; start_node_network_policies
  rm -f "$NODE_DIR/powered-off"
  # The API may still hold its Ready from before the power-off: the new kubelet must have renewed its lease.
  node "$k"; wait_until 120 "$NODE_NAME's kubelet to renew its lease" lease_renewed_since "$since"
  node "$k"; wait_until 120 "$NODE_NAME to be Ready" healthy_node_kubelet
  node "$k"; wait_until 60 "$NODE_NAME's kube-proxy" healthy_node_kube_proxy
  node "$k"; wait_until 60 "$NODE_NAME's NetworkPolicy engine" healthy_node_network_policies
  log "$NODE_NAME powered on and Ready"
}

lease_renewed_since() { # lease_renewed_since TIME (RFC 3339, microseconds, UTC)
  [[ "$(kubectl_admin -n kube-node-lease get lease "$NODE_NAME" -o jsonpath='{.spec.renewTime}')" > "$1" ]]
}

drain() {
  with_real_node "$1"
  kubectl_admin drain "$NODE_NAME" --ignore-daemonsets --delete-emptydir-data --timeout 300s
}

uncordon() { with_real_node "$1"; kubectl_admin uncordon "$NODE_NAME"; }

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  leftovers) leftovers ;;
  stop) stop_one "${2:?component}" ;;
  start) start_one "${2:?component}" ;;
  restart) stop_one "${2:?component}"; start_one "$2" ;;
  keelson-image) with_running_cluster; keelson_image "${2:?path of the keelson binary}" "${3:-}" ;;
  partition | heal | poweroff | poweron | drain | uncordon) "$1" "${2:-}" ;;
  *) echo "usage: $0 up|down|status|leftovers|stop NAME|start NAME|restart NAME|keelson-image BINARY [REF]|partition|heal|poweroff|poweron|drain|uncordon NODE" >&2; exit 2 ;;
esac
