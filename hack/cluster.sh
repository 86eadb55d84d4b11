#!/usr/bin/env bash
# A local Kubernetes control plane on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake nodes and pods).
#
#   hack/cluster.sh up             start it (idempotent); returns once it is ready
#   hack/cluster.sh down           stop exactly the processes `up` started (by pid)
#   hack/cluster.sh status         say whether it is up
#   hack/cluster.sh stop NAME      stop one component (failure tests)
#   hack/cluster.sh start NAME     start it again and wait until it is healthy
#   hack/cluster.sh restart NAME
#
# One file per component in hack/cluster/, each with `start_<name>` and
# `healthy_<name>`; stopping is by recorded pid. State, logs and the admin
# kubeconfig live in $KEELSON_CLUSTER_DIR (default target/dev-cluster). Ports
# come from $KEELSON_CLUSTER_PORT_BASE, else from a hash of that folder's
# path, moved on while any is taken.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${KEELSON_CLUSTER_DIR:-$ROOT/target/dev-cluster}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
NODES="${KEELSON_CLUSTER_NODES:-3}"
# In start order; processes only (storage is objects).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

for part in lib pki etcd kube-apiserver kube-controller-manager kube-scheduler kwok storage; do
  # shellcheck source=/dev/null
  source "$ROOT/hack/cluster/$part.sh"
done

fn() { echo "${1//-/_}"; } # component name → the suffix of its functions

# start_component NAME: starts it and waits until it is healthy.
start_component() {
  printf '%s\n' "${COMPONENTS[@]}" storage | grep -qx "$1" || die "unknown component $1 (one of: ${COMPONENTS[*]})"
  log "starting $1"
  "start_$(fn "$1")"
  wait_until 120 "$1 to be healthy" "healthy_$(fn "$1")"
}

all_alive() { local c; for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done; }

usage() {
  cat >&2 <<USAGE
Keelson dev cluster: Kubernetes $("$BIN/kube-apiserver" --version | cut -d' ' -f2), API server https://127.0.0.1:$API_PORT
  source $DIR/env        # sets KUBECONFIG and puts this cluster's kubectl first on PATH
  kubectl get nodes
  make cluster-down      # stops it (logs stay in $DIR)
USAGE
}

up() {
  BIN="$("$ROOT/hack/k8s-binaries.sh")"
  if [[ -f "$DIR/ports" ]] && all_alive; then
    # shellcheck disable=SC1091
    source "$DIR/ports"
    if healthy_kube_apiserver; then
      log "already up (API server https://127.0.0.1:$API_PORT)"
      usage
      return
    fi
  fi
  down_quietly
  local started=$SECONDS c
  pick_ports
  # shellcheck disable=SC1091
  source "$DIR/ports"
  make_pki
  write_kubeconfig
  for c in "${COMPONENTS[@]}" storage; do start_component "$c"; done
  all_alive || die "a component stopped after it started; see the logs in $DIR"
  log "cluster up in $((SECONDS - started))s"
  usage
}

down_quietly() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_pid "${COMPONENTS[$i]}"; done
  rm -rf "$DIR/etcd"
}

down() {
  down_quietly
  log "cluster stopped (logs kept in $DIR)"
}

with_running_cluster() {
  BIN="$("$ROOT/hack/k8s-binaries.sh")"
  [[ -f "$DIR/ports" ]] || die "no cluster in $DIR"
  # shellcheck disable=SC1091
  source "$DIR/ports"
}

stop_one() {
  with_running_cluster
  printf '%s\n' "${COMPONENTS[@]}" | grep -qx "$1" || die "unknown component $1 (one of: ${COMPONENTS[*]})"
  stop_pid "$1"
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
    healthy_kube_apiserver && { echo "up: https://127.0.0.1:$API_PORT"; return 0; }
  fi
  echo "down"; return 1
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  stop) stop_one "${2:?component}" ;;
  start) start_one "${2:?component}" ;;
  restart) stop_one "${2:?component}"; start_one "$2" ;;
  *) echo "usage: $0 up|down|status|stop NAME|start NAME|restart NAME" >&2; exit 2 ;;
esac
