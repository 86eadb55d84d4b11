# Sourced by hack/cluster.sh: the real node's pod network and its fence.
# A bridge with a /24 derived from the cluster folder (the node's IP is its
# gateway), CNI config for containerd (bridge + host-local), and iptables
# chains of our own that let pods reach each other and this host's bridge
# address, and nothing else: no forwarding to or from another interface, no
# masquerade outwards, and no packet from this host to KWOK's fake addresses.

KWOK_POD_CIDR=10.244.0.0/16
KWOK_NODE_IP=10.255.0.1
SERVICE_CIDR=10.96.0.0/16
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet)

start_network() {
  install_node_packages # iptables among them; a new machine may have none
  mkdir -p "$DIR/network" "$DIR/cni/net.d" "$DIR/cni/ipam"
  # Kept once, restored by stop_network: this host's settings before us.
  if [[ ! -f "$DIR/network/sysctl.saved" ]]; then
    local s; for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done > "$DIR/network/sysctl.saved"
  fi
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # NodePorts on 127.0.0.1: the kernel routes loopback-sourced packets to the
  # pods only if the bridge allows it (the setting goes with the bridge).
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  # Forwarding between pods and to services; br_netfilter so that replies
  # between pods on the bridge pass kube-proxy's conntrack.
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  fence_up
  cat > "$DIR/cni/net.d/10-keelson.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "keelson",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {
      "type": "host-local", "dataDir": "$DIR/cni/ipam",
      "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
CNI
}

# fence_up: one chain per hook, jumped to first, so that removing them
# removes exactly what we added.
fence_up() {
  fence_down
  iptables -N "$FENCE-FORWARD"
  iptables -A "$FENCE-FORWARD" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -A "$FENCE-FORWARD" -o "$BRIDGE" ! -i "$BRIDGE" -j DROP
  # Pods reach this host only at the node's address, but answer whatever it
  # asked (a NodePort on 127.0.0.1 reaches a pod from there).
  iptables -N "$FENCE-INPUT"
  iptables -A "$FENCE-INPUT" -i "$BRIDGE" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  iptables -A "$FENCE-INPUT" -i "$BRIDGE" ! -d "$NODE_IP" -j DROP
  iptables -N "$FENCE-OUTPUT" # fake addresses, and Service IPs no rule translated
  local cidr
  for cidr in "$KWOK_POD_CIDR" "$KWOK_NODE_IP/32" "$SERVICE_CIDR"; do
    iptables -A "$FENCE-OUTPUT" -d "$cidr" -j REJECT
  done
  iptables -I FORWARD 1 -j "$FENCE-FORWARD"
  iptables -I INPUT 1 -j "$FENCE-INPUT"
  iptables -I OUTPUT 1 -j "$FENCE-OUTPUT"
}

fence_down() {
  local hook
  for hook in FORWARD INPUT OUTPUT; do
    while iptables -D "$hook" -j "$FENCE-$hook" 2>/dev/null; do :; done
    iptables -F "$FENCE-$hook" 2>/dev/null || true
    iptables -X "$FENCE-$hook" 2>/dev/null || true
  done
}

healthy_network() {
  ip link show "$BRIDGE" up | grep -q UP && iptables -C FORWARD -j "$FENCE-FORWARD" 2>/dev/null
}

stop_network() {
  ip link del "$BRIDGE" 2>/dev/null || true
  fence_down
  if [[ -f "$DIR/network/sysctl.saved" ]]; then
    local line; while read -r line; do sysctl -qw "$line" || true; done < "$DIR/network/sysctl.saved"
    rm -f "$DIR/network/sysctl.saved"
  fi
  rm -rf "$DIR/cni/ipam"
}
