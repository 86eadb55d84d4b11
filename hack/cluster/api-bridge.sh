# Sourced by hack/cluster.sh: the API server for the real nodes and their
# pods. The API server listens on 127.0.0.1 only; keelson-api-bridge
# (crates/testkit) forwards this host's bridge address and the same port to
# it. The nodes' kubelets and kube-proxies use it, and the `kubernetes`
# Service's endpoint points there, so in-cluster clients (the instance
# managers of MyDatabase pods, an operator deployed on a node) find it as
# anywhere else. The fence lets pods and nodes reach this address only.

start_api_bridge() {
  (cd "$ROOT" && cargo build --quiet -p testkit --bin keelson-api-bridge) || die "cannot build keelson-api-bridge"
  cp "$ROOT/target/debug/keelson-api-bridge" "$DIR/keelson-api-bridge"
  start_program api-bridge "$DIR/keelson-api-bridge" --listen "$HOST_IP:$API_PORT" --to "127.0.0.1:$API_PORT"
  # --endpoint-reconciler-type none: the endpoint of `kubernetes` is ours to say.
  kubectl_admin apply --server-side --force-conflicts -f - >/dev/null <<SLICE
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: keelson.dev-cluster}
addressType: IPv4
endpoints: [{addresses: ["$HOST_IP"], conditions: {ready: true}}]
ports: [{name: https, port: $API_PORT, protocol: TCP}]
SLICE
}

healthy_api_bridge() {
  pid_alive api-bridge && [[ "$(curl -s --cacert "$DIR/pki/ca.crt" "https://$HOST_IP:$API_PORT/readyz")" == ok ]]
}
