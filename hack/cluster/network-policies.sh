# Sourced by hack/cluster.sh: the NetworkPolicy engine, kube-router's firewall
# alone (no routing, no service proxy, no CNI), one in each real node's
# network namespace like kube-proxy, reaching the API server through the API
# bridge with the components' identity. It writes iptables chains and ipsets
# in the node's namespace only; they go with it. KWOK's pods have no network:
# nothing enforces policies there.

start_network_policies() {
  local k
  for k in $(powered_nodes); do node "$k"; start_node_network_policies; done
}

start_node_network_policies() {
  start_program "network-policies-$NODE_K" "${IN_NODE[@]}" "$NODE_BIN/kube-router" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --kubeconfig "$DIR/kube-proxy/node.kubeconfig" --hostname-override "$NODE_NAME" \
    --health-port "$NETPOL_HEALTH_PORT" --metrics-port 0 --v 1
}

healthy_network_policies() {
  local k
  for k in $(powered_nodes); do node "$k"; healthy_node_network_policies || return 1; done
}

healthy_node_network_policies() { curl -sf "http://$NODE_IP:$NETPOL_HEALTH_PORT/healthz" >/dev/null; }

stop_network_policies() { stop_pid $(node_numbers | sed 's/^/network-policies-/'); }
