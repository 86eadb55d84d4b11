# Sourced by hack/cluster.sh: kube-scheduler (kwok acts only on scheduled pods).

start_kube_scheduler() {
  start kube-scheduler --kubeconfig "$DIR/components.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false \
    --kube-api-qps 500 --kube-api-burst 1000 --profiling=false --v 1
}

healthy_kube_scheduler() { curl -sfk "https://127.0.0.1:$SCHED_PORT/healthz"; }
