# Sourced by hack/cluster.sh: kwok and its fake nodes, which keep pods
# Running (Job pods Succeeded) without a kubelet. Their addresses are data only.
# Beside a real node they carry a NoSchedule taint: only pods of namespaces
# that ask for fake nodes (see fake_nodes_namespace in hack/cluster.sh) go there.

start_kwok() {
  start kwok --kubeconfig "$DIR/components.kubeconfig" --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --cidr 10.244.0.0/16 --node-ip 10.255.0.1 --server-address "127.0.0.1:$KWOK_PORT" \
    --config "$BIN/kwok-stages.yaml"
  local i
  for ((i = 0; i < NODES; i++)); do
    cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64, topology.kubernetes.io/zone: zone-$((i % 3))}
spec:
  taints: [$KWOK_TAINTS]
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "1500", ephemeral-storage: 1Ti}
  capacity: {cpu: "32", memory: 256Gi, pods: "1500", ephemeral-storage: 1Ti}
NODE
  done | kubectl_admin apply --server-side -f - >/dev/null
}

healthy_kwok() { # every fake node Ready
  local ready
  ready=$(kubectl_admin get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)
  [[ "$ready" -ge "$NODES" ]]
}
