# Sourced by hack/cluster.sh: cluster DNS for the real nodes' pods, CoreDNS
# on this host's bridge address. It answers cluster.local names from the API
# server and nothing else: there is no upstream to forward to.

start_coredns() {
  mkdir -p "$DIR/coredns"
  cat > "$DIR/coredns/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $HOST_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/components.kubeconfig keelson-dev
        pods insecure
    }
    ready 127.0.0.1:$DNS_READY_PORT
    cache 5
}
.:53 {
    bind $HOST_IP
    errors
}
COREFILE
  start_program coredns "$NODE_BIN/coredns" -conf "$DIR/coredns/Corefile"
}

healthy_coredns() { curl -sf "http://127.0.0.1:$DNS_READY_PORT/ready"; }
