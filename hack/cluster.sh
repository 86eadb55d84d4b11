#!/usr/bin/env bash
# A local Kubernetes cluster: the control plane on loopback (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler), KWOK's fake nodes
# for scale, and one real node (containerd, kubelet, kube-proxy, CoreDNS, a
# bridge pod network behind a fence) where pods run real containers from
# images built on this machine. Volumes come from keelson-local-volumes.
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
#   hack/cluster.sh keelson-image BINARY   the operator's image from BINARY, imported
#                                  into the node (MyDatabase pods' instance manager);
#                                  prints its reference
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
# The machine-wide claim of the one real node a machine can hold (kube-proxy's
# iptables chains and the kubelet's cgroups are not per cluster).
NODE_OWNER=/run/keelson-node.owner

PARTS=(lib pki etcd kube-apiserver kube-controller-manager kube-scheduler kwok network api-bridge containerd images kubelet kube-proxy coredns storage)
for part in "${PARTS[@]}"; do
  # shellcheck source=/dev/null
  source "$ROOT/hack/cluster/$part.sh"
done
node_settings

# Components in start order, and the processes among them (pid files).
profile() { cat "$DIR/profile" 2>/dev/null || echo "${KEELSON_CLUSTER_PROFILE:-node}"; }
components() {
  echo etcd kube-apiserver kube-controller-manager kube-scheduler kwok
  [[ "$(profile)" == kwok ]] || echo network api-bridge containerd images kubelet kube-proxy coredns
  echo storage
}
processes() {
  echo etcd kube-apiserver kube-controller-manager kube-scheduler kwok
  [[ "$(profile)" == kwok ]] || echo api-bridge containerd kubelet kube-proxy coredns
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
  [[ -n "$owner" && "$owner" != "$DIR" && -f "$owner/kubelet.pid" ]] && kill -0 "$(cat "$owner/kubelet.pid")" 2>/dev/null \
    && echo "$owner"
}

claim_node() {
  [[ "${KEELSON_CLUSTER_PROFILE:-node}" == kwok ]] && return
  [[ $(id -u) -eq 0 ]] || die "the real node needs root (bridge, iptables, mounts); or use KEELSON_CLUSTER_PROFILE=kwok"
  local owner
  owner="$(other_node_owner || true)"
  [[ -z "$owner" ]] || die "the real node of another cluster ($owner) runs on this machine; stop it first (hack/cluster.sh down with KEELSON_CLUSTER_DIR=$owner), or start this one with KEELSON_CLUSTER_PROFILE=kwok"
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

# Undoes the real node: its processes, the pods' processes, the mounts under
# the cluster's folders, the network and the kubelet's cgroups.
down_node() {
  local owner
  owner="$(other_node_owner || true)"
  if [[ -n "$owner" ]]; then log "the real node on this machine is $owner's; leaving it alone"; return 0; fi
  stop_pid coredns kube-proxy kubelet api-bridge
  kill_cgroup_processes
  stop_pid containerd
  kill_shims
  unmount_under "$DIR" "$RUN"
  stop_network
  remove_kubernetes_chains
  remove_cgroups
  # The runtime's root (imported images) stays for the next `up`.
  rm -rf "$RUN" "$DIR/kubelet/root" "$DIR/volumes"
  [[ "$(cat "$NODE_OWNER" 2>/dev/null)" == "$DIR" ]] && rm -f "$NODE_OWNER"
  return 0
}

down_quietly() {
  stop_pid local-volumes kwok kube-scheduler kube-controller-manager
  # The node's leftovers are undone even if its processes are gone already.
  if [[ "$(profile)" != kwok && ( -f "$DIR/containerd.pid" || -d "$RUN" ) ]]; then down_node; fi
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
  if compgen -G "/sys/fs/cgroup/*/kubepods" >/dev/null; then echo "cgroups: $(compgen -G "/sys/fs/cgroup/*/kubepods" | head -3)"; found=1; fi
  if [[ -e "$RUN" ]]; then echo "runtime folder $RUN"; found=1; fi
  [[ $found -eq 0 ]] && echo "nothing left behind"
  return "$found"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  leftovers) leftovers ;;
  stop) stop_one "${2:?component}" ;;
  start) start_one "${2:?component}" ;;
  restart) stop_one "${2:?component}"; start_one "$2" ;;
  keelson-image) with_running_cluster; keelson_image "${2:?path of the keelson binary}" ;;
  *) echo "usage: $0 up|down|status|leftovers|stop NAME|start NAME|restart NAME|keelson-image BINARY" >&2; exit 2 ;;
esac
