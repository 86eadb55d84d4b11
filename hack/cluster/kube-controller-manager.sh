# Sourced by hack/cluster.sh: kube-controller-manager (Deployments,
# ReplicaSets, StatefulSets, Jobs, CronJobs, the garbage collector, the
# volume binder and expander that hack/cluster/storage.sh's provisioner serves).

start_kube_controller_manager() {
  start kube-controller-manager --kubeconfig "$DIR/components.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
    --controllers '*' \
    --authorization-always-allow-paths /healthz,/readyz,/livez,/metrics \
    --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 --concurrent-statefulset-syncs 10 \
    --concurrent-gc-syncs 20 --kube-api-qps 500 --kube-api-burst 1000 --profiling=false --v 1
}

healthy_kube_controller_manager() { curl -sfk "https://127.0.0.1:$KCM_PORT/healthz"; }
