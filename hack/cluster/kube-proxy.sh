# Sourced by hack/cluster.sh: kube-proxy (iptables mode) for the real node.
# NodePorts answer on 127.0.0.1 and on the node's bridge address only. It
# leaves the host's conntrack settings alone; `hack/cluster.sh down` removes
# its rules (remove_kubernetes_chains).

start_kube_proxy() {
  mkdir -p "$DIR/kube-proxy"
  cat > "$DIR/kube-proxy/config.yaml" <<CFG
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$DIR/components.kubeconfig"}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$PROXY_HEALTH_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: [127.0.0.0/8, $NODE_IP/32]
iptables: {localhostNodePorts: true, masqueradeAll: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
CFG
  start_program kube-proxy "$NODE_BIN/kube-proxy" --config "$DIR/kube-proxy/config.yaml" --v 1
}

healthy_kube_proxy() { curl -sf "http://127.0.0.1:$PROXY_HEALTH_PORT/healthz"; }
