#!/usr/bin/env bash
# A local Kubernetes control plane on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake nodes and pods).
#
#   hack/cluster.sh up      start it (idempotent); returns once it is ready
#   hack/cluster.sh down    stop exactly the processes `up` started (by pid)
#   hack/cluster.sh status  say whether it is up
#
# State, logs and the admin kubeconfig live in $KEELSON_CLUSTER_DIR
# (default target/dev-cluster). Ports come from $KEELSON_CLUSTER_PORT_BASE,
# else from a hash of that folder's path, moved on while any is taken.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${KEELSON_CLUSTER_DIR:-$ROOT/target/dev-cluster}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
NODES="${KEELSON_CLUSTER_NODES:-3}"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

pid_alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_ports() {
  local base
  if [[ -n "${KEELSON_CLUSTER_PORT_BASE:-}" ]]; then
    base="$KEELSON_CLUSTER_PORT_BASE"
  else
    base=$(( 20000 + ($(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 2000) * 10 ))
  fi
  local tries=0
  while :; do
    local busy=0 p
    for p in $(seq "$base" $((base + 9))); do port_in_use "$p" && { busy=1; break; }; done
    [[ $busy -eq 0 ]] && break
    tries=$((tries + 1)); [[ $tries -lt 50 ]] || die "no free block of ports near $base"
    base=$((base + 10))
  done
  cat > "$DIR/ports" <<PORTS
ETCD_PORT=$base
ETCD_PEER_PORT=$((base + 1))
API_PORT=$((base + 2))
KCM_PORT=$((base + 3))
SCHED_PORT=$((base + 4))
KWOK_PORT=$((base + 5))
KEELSON_METRICS_PORT=$((base + 7))
KEELSON_HEALTH_PORT=$((base + 8))
PORTS
}

api() { # api PATH: GET on the API server with the admin token
  curl -sS --max-time 5 --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $(cat "$DIR/pki/admin.token")" "https://127.0.0.1:$API_PORT$1"
}

make_pki() {
  local pki="$DIR/pki"
  [[ -f "$pki/apiserver.crt" ]] && return
  command -v openssl >/dev/null || die "openssl is required"
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=keelson-dev-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > "$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pki/admin.token"
  printf '%s,admin,admin-uid,"system:masters"\n' "$(cat "$pki/admin.token")" > "$pki/tokens.csv"
}

write_kubeconfig() {
  cat > "$DIR/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: keelson-dev
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$DIR/pki/admin.token")
contexts:
- name: keelson-dev
  context: {cluster: keelson-dev, user: admin}
current-context: keelson-dev
KC
  cat > "$DIR/env" <<ENV
# source this file to use the Keelson dev cluster
export KUBECONFIG="$DIR/kubeconfig"
export PATH="$BIN:\$PATH"
ENV
  # Writes at Metadata level: benchmarks count them per user. With
  # KEELSON_AUDIT_READS=1 (the default), also reads of ServiceAccounts and of
  # admin, whom the tests' operators impersonate their ServiceAccount through:
  # the RBAC audit test needs every verb they use. Benchmarks turn it off.
  local reads=""
  if [[ "${KEELSON_AUDIT_READS:-1}" == 1 ]]; then
    reads='- level: Metadata
  verbs: [get, list, watch]
  userGroups: ["system:serviceaccounts"]
- level: Metadata
  verbs: [get, list, watch]
  users: [admin]'
  fi
  cat > "$DIR/audit-policy.yaml" <<AUDIT
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
$reads
- level: None
  verbs: [get, list, watch]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
  users: [admin, "system:kube-controller-manager", "system:kube-scheduler"]
- level: Metadata
AUDIT
}

start() { # start NAME ARGS...: runs one component in the background, logging to DIR/NAME.log
  local name="$1"; shift
  pid_alive "$name" && return
  setsid "$BIN/$name" "$@" >>"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}

wait_until() { # wait_until SECONDS WHAT CMD...
  local limit="$1" what="$2"; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start > limit )); then
      log "timed out after ${limit}s waiting for $what; last log lines:"
      local c; for c in "${COMPONENTS[@]}"; do [[ -f "$DIR/$c.log" ]] && { echo "--- $c.log" >&2; tail -n 15 "$DIR/$c.log" >&2; }; done
      die "$what not ready"
    fi
    sleep 0.5
  done
}

readyz_ok() { [[ "$(api /readyz 2>/dev/null)" == "ok" ]]; }

nodes_ready() {
  local ready
  ready=$("$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)
  [[ "$ready" -ge "$NODES" ]]
}

default_sa_exists() { "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" -n default get serviceaccount default; }

all_alive() { local c; for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done; }

cluster_objects() {
  local i
  {
    for ((i = 0; i < NODES; i++)); do
      cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64, topology.kubernetes.io/zone: zone-$((i % 3))}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "1500", ephemeral-storage: 1Ti}
  capacity: {cpu: "32", memory: 256Gi, pods: "1500", ephemeral-storage: 1Ti}
NODE
    done
    cat <<SC
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
allowVolumeExpansion: true
SC
  } | "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" apply --server-side -f - >/dev/null
}

etcd_ok() { curl -sf "http://127.0.0.1:$ETCD_PORT/health"; }

start_component() { # start_component NAME: one component with its flags
  case "$1" in
    etcd)
      log "starting etcd on 127.0.0.1:$ETCD_PORT"
      start etcd --name default --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn ;;
    kube-apiserver)
      log "starting kube-apiserver on 127.0.0.1:$API_PORT"
      start kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
        --client-ca-file "$DIR/pki/ca.crt" --token-auth-file "$DIR/pki/tokens.csv" \
        --authorization-mode Node,RBAC --allow-privileged=true \
        --enable-admission-plugins OwnerReferencesPermissionEnforcement \
        --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
        --audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
        --audit-log-maxsize 200 --audit-log-maxbackup 2 \
        --profiling=false --v 1 ;;
    kube-controller-manager)
      start kube-controller-manager --kubeconfig "$DIR/kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
        --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
        --controllers '*' --enable-hostpath-provisioner=true \
        --authorization-always-allow-paths /healthz,/readyz,/livez,/metrics \
        --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 --concurrent-statefulset-syncs 10 \
        --concurrent-gc-syncs 20 --kube-api-qps 500 --kube-api-burst 1000 --profiling=false --v 1 ;;
    kube-scheduler)
      start kube-scheduler --kubeconfig "$DIR/kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false \
        --kube-api-qps 500 --kube-api-burst 1000 --profiling=false --v 1 ;;
    kwok)
      start kwok --kubeconfig "$DIR/kubeconfig" --manage-all-nodes=false \
        --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
        --cidr 10.244.0.0/16 --node-ip 10.255.0.1 --server-address "127.0.0.1:$KWOK_PORT" \
        --config "$BIN/kwok-stages.yaml" ;;
    *) die "unknown component $1 (one of: ${COMPONENTS[*]})" ;;
  esac
}

up() {
  BIN="$("$ROOT/hack/k8s-binaries.sh")"
  if [[ -f "$DIR/ports" ]] && all_alive; then
    # shellcheck disable=SC1091
    source "$DIR/ports"
    if readyz_ok; then
      log "already up (API server https://127.0.0.1:$API_PORT)"
      usage
      return
    fi
  fi
  down_quietly
  local started=$SECONDS
  pick_ports
  # shellcheck disable=SC1091
  source "$DIR/ports"
  make_pki
  write_kubeconfig
  start_component etcd
  wait_until 60 etcd etcd_ok
  start_component kube-apiserver
  wait_until 120 "kube-apiserver /readyz" readyz_ok
  log "starting kube-controller-manager, kube-scheduler and kwok"
  start_component kube-controller-manager
  start_component kube-scheduler
  start_component kwok
  sleep 1
  all_alive || wait_until 0 "every component to stay up" all_alive
  cluster_objects
  wait_until 120 "$NODES Ready nodes" nodes_ready
  wait_until 120 "the default ServiceAccount" default_sa_exists
  log "cluster up in $((SECONDS - started))s"
  usage
}

usage() {
  cat >&2 <<USAGE
Keelson dev cluster: Kubernetes $("$BIN/kube-apiserver" --version | cut -d' ' -f2), API server https://127.0.0.1:$API_PORT
  source $DIR/env        # sets KUBECONFIG and puts this cluster's kubectl first on PATH
  kubectl get nodes
  make cluster-down      # stops it (logs stay in $DIR)
USAGE
}

stop_pid() { # stop_pid NAME: SIGTERM the recorded pid, then SIGKILL after 10 s
  local name="$1" pid
  [[ -f "$DIR/$name.pid" ]] || return 0
  pid="$(cat "$DIR/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/$name.pid"
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

# One component of a running cluster, for failure tests: `stop NAME`, `start NAME`
# (waits until it serves again where it has a health check), `restart NAME`.
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
  case "$1" in
    etcd) wait_until 60 etcd etcd_ok ;;
    kube-apiserver) wait_until 120 "kube-apiserver /readyz" readyz_ok ;;
  esac
  log "started $1"
}

status() {
  if [[ -f "$DIR/ports" ]] && all_alive; then
    # shellcheck disable=SC1091
    source "$DIR/ports"
    readyz_ok && { echo "up: https://127.0.0.1:$API_PORT"; return 0; }
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
