# Sourced by hack/cluster.sh: kube-proxy (iptables mode). One in each real
# node's network namespace (Services for its pods, NodePorts on its address),
# reaching the API server through the API bridge like the kubelet; and one on
# this host, so that NodePorts answer on 127.0.0.1 and this host reaches
# Services, whichever node their pods are on. It leaves the host's conntrack
# settings alone; `hack/cluster.sh down` removes the host's rules
# (remove_kubernetes_chains), a node's go with its namespace.

start_kube_proxy() {
  mkdir -p "$DIR/kube-proxy"
  # The nodes reach the API server at this host's bridge address.
  sed "s|server: https://127.0.0.1:|server: https://$HOST_IP:|" "$DIR/components.kubeconfig" > "$DIR/kube-proxy/node.kubeconfig"
  local k
  for k in $(node_numbers); do node "$k"; start_node_kube_proxy; done
  # The host's: NodePorts on loopback only. It borrows node 1's name, as
  # kube-proxy waits 30 s at start for a Node of its own name; only Services
  # with internalTrafficPolicy: Local would see the difference.
  node 1
  write_kube_proxy_config host "$NODE_NAME" "$DIR/components.kubeconfig" 127.0.0.1 "[127.0.0.0/8]" true
  start_program kube-proxy "$NODE_BIN/kube-proxy" --config "$DIR/kube-proxy/host.yaml" --v 1
}

start_node_kube_proxy() {
  write_kube_proxy_config "node-$NODE_K" "$NODE_NAME" "$DIR/kube-proxy/node.kubeconfig" "$NODE_IP" "[$NODE_IP/32]" false
  start_program "kube-proxy-$NODE_K" "${IN_NODE[@]}" "$NODE_BIN/kube-proxy" --config "$DIR/kube-proxy/node-$NODE_K.yaml" --v 1
}

# write_kube_proxy_config FILE NODE KUBECONFIG BIND NODEPORT_ADDRESSES LOCALHOST_NODEPORTS
write_kube_proxy_config() {
  cat > "$DIR/kube-proxy/$1.yaml" <<CFG
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$3"}
hostnameOverride: $2
mode: iptables
clusterCIDR: $CLUSTER_POD_CIDR
healthzBindAddress: $4:$PROXY_HEALTH_PORT
metricsBindAddress: $4:$PROXY_METRICS_PORT
nodePortAddresses: $5
iptables: {localhostNodePorts: $6, masqueradeAll: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
CFG
}

healthy_kube_proxy() {
  curl -sf "http://127.0.0.1:$PROXY_HEALTH_PORT/healthz" || return 1
  local k
  for k in $(node_numbers); do node "$k"; healthy_node_kube_proxy || return 1; done
}

healthy_node_kube_proxy() { curl -sf "http://$NODE_IP:$PROXY_HEALTH_PORT/healthz"; }

stop_kube_proxy() { stop_pid kube-proxy $(node_numbers | sed 's/^/kube-proxy-/'); }
