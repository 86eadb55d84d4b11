#!/usr/bin/env bash
# `make demo`: the tutorial's walk-through on the local cluster.
#   hack/demo.sh                 run it (leaves the cluster and operator up)
#   hack/demo.sh stop-operator   stop the demo operator (scale the in-cluster one to 0)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DIR="${KEELSON_CLUSTER_DIR:-$ROOT/target/dev-cluster}"
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*" >&2; "$@"; }

# The operator as `make deploy` runs it: a pod of the Deployment keelson-controller-manager.
OPERATOR=(-n keelson-system deployment/keelson-controller-manager)
operator_log() { kubectl logs "${OPERATOR[@]}" --tail=-1 2>/dev/null; }

# Stops a demo operator: the in-cluster one (scaled to 0, so the tests' own operators have
# the cluster to themselves), and a background process of an older demo.
stop_operator() {
  if [[ -f "$DIR/env" ]]; then
    # shellcheck disable=SC1091
    source "$DIR/env"
    if kubectl get "${OPERATOR[@]}" >/dev/null 2>&1; then
      kubectl scale "${OPERATOR[@]}" --replicas=0 >/dev/null
      kubectl -n keelson-system wait --for=delete pod -l app.kubernetes.io/name=keelson --timeout=60s >/dev/null 2>&1 || true
    fi
  fi
  if [[ -f "$DIR/keelson.pid" ]]; then
    local pid; pid="$(cat "$DIR/keelson.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then echo "operator $pid did not stop in 30 s; killing it" >&2; kill -KILL "$pid"; fi
    fi
    rm -f "$DIR/keelson.pid"
  fi
}

if [[ "${1:-}" == "stop-operator" ]]; then stop_operator; exit 0; fi

say "Bringing up the local cluster: control plane, KWOK's fake nodes, three real nodes (first run builds Kubernetes and the stand-in images: ~30-45 min)"
hack/cluster.sh up
# shellcheck disable=SC1091
source "$DIR/env"
# shellcheck disable=SC1091
source "$DIR/ports"

say "Building keelson"
cargo build --quiet --bin keelson

say "make docker-build + make deploy IMG=...: the operator as a pod on a real node"
stop_operator
# No docker here: the image is built offline from this binary and loaded into the nodes.
# MyDatabase pods copy their instance manager from the same image.
img="keelson:demo-$(sha256sum target/debug/keelson | cut -c1-12)"
run hack/cluster.sh keelson-image target/debug/keelson "$img"
printf '$ %s\n' "target/debug/keelson manifests all --image $img | kubectl apply --server-side --force-conflicts -f -" >&2
target/debug/keelson manifests all --image "$img" | kubectl apply --server-side --force-conflicts -f - >/dev/null
kubectl scale "${OPERATOR[@]}" --replicas=1 >/dev/null
run kubectl rollout status "${OPERATOR[@]}" --timeout=180s
run kubectl -n keelson-system get pods -o wide

say "kubectl apply -f config/samples/webapp.yaml (the tutorial's sandy-app)"
kubectl delete webapp sandy-app --ignore-not-found --wait >/dev/null
run cat config/samples/webapp.yaml
run kubectl apply -f config/samples/webapp.yaml
kubectl wait --for=jsonpath='{.status.phase}'=Running webapp/sandy-app --timeout=120s >/dev/null
run kubectl get webapps
run kubectl get pods -l app=sandy-app -o wide
node_port="$(kubectl get service sandy-app-service -o jsonpath='{.spec.ports[0].nodePort}')"
say "The tutorial's nginx answers on the NodePort, on 127.0.0.1 (real containers; the image is a stand-in built from Debian's nginx)"
serving() { curl -sf -o /dev/null "http://127.0.0.1:$node_port/"; }
for _ in $(seq 1 300); do serving && break; sleep 0.2; done # kube-proxy programs a new Service within a second or so
run curl -s "http://127.0.0.1:$node_port/"
run kubectl logs -l app=sandy-app --prefix --tail 1

say "An outsider scales the Deployment behind the operator's back"
kubectl get webapp sandy-app --watch -o custom-columns=PHASE:.status.phase,REPLICAS:.spec.replicas,AVAILABLE:.status.availableReplicas,DEPLOYMENT_PODS:.status.replicas \
  > "$DIR/demo-watch.txt" 2>&1 &
watch_pid=$!
sleep 1
run kubectl scale deployment sandy-app --replicas=10
until operator_log | grep -q "Drift detected! Updating Deployment"; do sleep 0.2; done
say "Operator log (kubectl -n keelson-system logs deployment/keelson-controller-manager)"
operator_log | grep "Drift detected! Updating Deployment" | tail -1
# Settled: Running with 3 pods and no extra pod left, twice in a row.
settled() {
  [[ "$(kubectl get webapp sandy-app -o jsonpath='{.status.phase}/{.status.replicas}')" == "Running/3" ]] &&
    [[ "$(kubectl get pods -l app=sandy-app --no-headers 2>/dev/null | wc -l)" -eq 3 ]]
}
until settled && sleep 1 && settled; do sleep 0.5; done
kill "$watch_pid" 2>/dev/null || true
say "The WebApp as it went (kubectl get webapp sandy-app --watch)"
cat "$DIR/demo-watch.txt"
run kubectl get webapps
run kubectl get deployment sandy-app
run kubectl get events --field-selector involvedObject.kind=WebApp,reason=DriftCorrected
say "An outsider deletes the Service: it is back at once and serves (Kubernetes allocates a new NodePort to a new Service)"
run kubectl delete service sandy-app-service
until [[ "$(kubectl get service sandy-app-service -o jsonpath='{.spec.ports[0].nodePort}' 2>/dev/null)" =~ ^[0-9]+$ ]]; do sleep 0.2; done
node_port="$(kubectl get service sandy-app-service -o jsonpath='{.spec.ports[0].nodePort}')"
for _ in $(seq 1 300); do serving && break; sleep 0.2; done
run kubectl get service sandy-app-service
run curl -s -o /dev/null -w '%{http_code} from 127.0.0.1:%{remote_port}\n' "http://127.0.0.1:$node_port/"

if [[ -f config/samples/mydatabase.yaml ]]; then
  say "The tutorial's MyDatabase"
  run cat config/samples/mydatabase.yaml
  run kubectl apply -f config/samples/mydatabase.yaml
  kubectl wait --for=jsonpath='{.status.phase}'=Running mydatabase/production-db --timeout=180s >/dev/null || true
  kubectl wait --for=jsonpath='{.status.instances}'=3/3 mydatabase/production-db --timeout=180s >/dev/null || true
  run kubectl get mydatabases
  run kubectl get statefulsets,services,cronjobs,secrets,pvc -l app.kubernetes.io/instance=production-db
  run kubectl get pods -l keelson.dev/cluster=production-db -L keelson.dev/role -o wide
  # Which pod is primary is Keelson's choice (pod 0 at first; a failover moves it).
  primary="$(kubectl get mydatabase production-db -o jsonpath='{.status.currentPrimary}')"
  replica="$(kubectl get mydatabase production-db -o jsonpath='{.status.instanceStatuses[?(@.role=="replica")].name}' | cut -d' ' -f1)"
  run kubectl get mydatabase production-db -o jsonpath='primary {.status.currentPrimary}, PostgreSQL {.status.serverVersion}{"\n"}{range .status.instanceStatuses[*]}{.name} {.role} ready={.ready} lagBytes={.lagBytes}{"\n"}{end}'
  say "Real PostgreSQL in those pods: the primary, and replicas streaming from it"
  run kubectl exec "$primary" -- psql -d app -tAc "select pg_is_in_recovery(), version()"
  run kubectl exec "$primary" -- psql -d app -c "select application_name, client_addr, state, sync_state from pg_stat_replication"
  say "A row written through the -rw Service with the connection Secret's URI, read on a replica"
  # shellcheck disable=SC2016
  run kubectl exec "$replica" -- bash -c 'psql "postgresql://app:$(cat /etc/keelson/credentials/password)@production-db-rw:5432/app?sslmode=verify-full&sslrootcert=/etc/keelson/tls/ca.crt" -c "create table if not exists orders (id int primary key, item text)" -c "insert into orders values (1, '"'"'written through -rw'"'"') on conflict do nothing"'
  until [[ "$(kubectl exec "$replica" -- psql -d app -tAc "select count(*) from orders" 2>/dev/null)" == 1 ]]; do sleep 0.2; done
  run kubectl exec "$replica" -- psql -d app -c "select pg_is_in_recovery() as replica, * from orders"
  say "A backup now, from the CronJob's own template (as 02:00 would run it), taken from a replica"
  kubectl delete job production-db-backup-now --ignore-not-found >/dev/null
  old_backup="$(kubectl get mydatabase production-db -o jsonpath='{.status.lastBackupName}')"
  run kubectl create job --from=cronjob/production-db-backup production-db-backup-now
  for _ in $(seq 1 600); do
    new_backup="$(kubectl get mydatabase production-db -o jsonpath='{.status.lastBackupName}')"
    [[ -n "$new_backup" && "$new_backup" != "$old_backup" ]] && break
    sleep 0.2
  done
  run kubectl logs job/production-db-backup-now
  run kubectl get mydatabases
  run kubectl get mydatabase production-db -o jsonpath='{.status.lastBackupName} {.status.lastBackupSizeBytes} bytes{"\n"}'
  run kubectl get mydatabase production-db -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'
  say "Restore: a new MyDatabase from that backup (spec.restoreFrom), with its own credentials"
  kubectl delete mydatabase production-db-copy --ignore-not-found --wait >/dev/null
  kubectl delete pvc data-production-db-copy-0 data-production-db-copy-1 --ignore-not-found >/dev/null
  run cat config/samples/mydatabase-restore.yaml
  run kubectl apply -f config/samples/mydatabase-restore.yaml
  for _ in $(seq 1 900); do
    [[ "$(kubectl get mydatabase production-db-copy -o jsonpath='{.status.phase}')" == Running ]] && break
    sleep 0.2
  done
  run kubectl get mydatabases
  run kubectl exec production-db-copy-0 -- psql -d app -c "select * from orders"
  say "Failover: force-delete the primary's pod; Keelson promotes the replica that received the most WAL"
  primary="$(kubectl get mydatabase production-db -o jsonpath='{.status.currentPrimary}')"
  run kubectl delete pod "$primary" --grace-period=0 --force
  promoted="$primary"
  for _ in $(seq 1 600); do
    promoted="$(kubectl get mydatabase production-db -o jsonpath='{.status.currentPrimary}')"
    [[ -n "$promoted" && "$promoted" != "$primary" ]] && break
    sleep 0.1
  done
  run kubectl get mydatabase production-db -o jsonpath='{.status.lastFailover}{"\n"}'
  run kubectl exec "$promoted" -- psql -d app -c "select pg_is_in_recovery() as replica, * from orders"
  for _ in $(seq 1 900); do
    [[ "$(kubectl get mydatabase production-db -o jsonpath='{.status.instances}')" == 3/3 ]] && break
    sleep 0.2
  done
  run kubectl get pods -l keelson.dev/cluster=production-db,app.kubernetes.io/component=database -L keelson.dev/role
  say "Switchover: move the primary back to $primary, now a streaming replica (a clean hand-over)"
  for _ in $(seq 1 600); do
    [[ "$(kubectl get mydatabase production-db -o jsonpath="{.status.instanceStatuses[?(@.name==\"$primary\")].ready}")" == true ]] && break
    sleep 0.2
  done
  run kubectl annotate mydatabase production-db db.keelson.dev/switchover-to="$primary"
  for _ in $(seq 1 600); do
    [[ "$(kubectl get mydatabase production-db -o jsonpath='{.status.lastFailover.kind}/{.status.lastFailover.to}/{.status.lastFailover.writesDownMs}')" == Switchover/"$primary"/?* ]] && break
    sleep 0.1
  done
  run kubectl get mydatabase production-db -o jsonpath='{.status.lastFailover}{"\n"}'
  # Events are published in the background: wait for this one.
  for _ in $(seq 1 100); do
    kubectl get events --field-selector reason=Switchover -o jsonpath='{.items[*].message}' | grep -q "switchover to $primary requested" && break
    sleep 0.1
  done
  run kubectl get events --field-selector reason=Switchover -o custom-columns=REASON:.reason,MESSAGE:.message
fi

say "Done. The cluster and the operator are still running:"
cat <<EOF2
  source $DIR/env                 # kubectl for this cluster
  kubectl -n keelson-system logs -f deployment/keelson-controller-manager   # the operator's log
  make cluster-down               # stop the cluster, and the operator with it
EOF2
