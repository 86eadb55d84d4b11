# Sourced by hack/cluster.sh: the real nodes' network and its fence.
#
# The host's bridge `keelson<N>` is the nodes' link: this host is its
# gateway ($HOST_IP: API bridge and CoreDNS), each node a network namespace
# of ours plugged into it by a veth pair ($NODE_IP). Inside a node, the CNI
# bridge plugin gives its pods a /26 of their own; every node and this host
# route the other nodes' pod subnets to their node address (host-gw, as
# flannel does), so pods reach each other by IP across nodes.
#
# The fence, chains of our own jumped to first: nothing is forwarded between
# the bridge and another interface, pods and nodes reach this host only at
# $HOST_IP, no masquerade outwards, and no packet from this host or a node to
# KWOK's fake addresses. A partition takes a node's link down.

KWOK_POD_CIDR=10.244.0.0/16
KWOK_NODE_IP=10.255.0.1
SERVICE_CIDR=10.96.0.0/16
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet)

start_network() {
  install_node_packages # iptables among them; a new machine may have none
  mkdir -p "$DIR/network"
  # Kept once, restored by stop_network: this host's settings before us.
  if [[ ! -f "$DIR/network/sysctl.saved" ]]; then
    local s; for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done > "$DIR/network/sysctl.saved"
  fi
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$HOST_IP/26" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # NodePorts on 127.0.0.1: the kernel routes loopback-sourced packets to the
  # pods only if the bridge allows it (the setting goes with the bridge).
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  fence_up
  # The rest of the cluster's /24 (a node that is off, addresses no node has)
  # is unreachable here, never sent on by the default route.
  ip route replace unreachable "$CLUSTER_POD_CIDR"
  local k
  for k in $(node_numbers); do node "$k"; start_node_network; done
}

# start_node_network: node NODE_K's namespace, its link, routes and CNI config
# (idempotent: `poweron` and `heal` run it again).
start_node_network() {
  mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam"
  [[ -e "/run/netns/$NETNS" ]] || ip netns add "$NETNS"
  if ! ip link show "$VETH" >/dev/null 2>&1; then
    # A fixed address, as a real node's NIC keeps across a reboot: after a
    # poweron the other nodes' neighbour entries for it are still right (a new
    # random one left them sending to the old address for seconds).
    ip link add "$VETH" type veth peer name eth0 address "$(printf '02:6b:65:%02x:00:%02x' "$CLUSTER_ID" "$NODE_K")" netns "$NETNS"
  fi
  ip link set "$VETH" master "$BRIDGE" up
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" addr replace "$NODE_IP/26" dev eth0
  ip -n "$NETNS" link set eth0 up
  ip -n "$NETNS" route replace default via "$HOST_IP" dev eth0
  local j
  for j in $(node_numbers); do
    (( j == NODE_K )) && continue
    ip -n "$NETNS" route replace "10.88.$CLUSTER_ID.$((64 * j))/26" via "10.88.$CLUSTER_ID.$((10 + j))" dev eth0 onlink
  done
  ip route replace "$POD_CIDR" via "$NODE_IP" dev "$BRIDGE"
  # Forwarding for its pods, and br_netfilter on its CNI bridge so that
  # kube-proxy's rules see traffic between pods of one node (per namespace).
  in_node sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  # Nothing from the node to KWOK's fake addresses (a Service with fake endpoints).
  local cidr
  in_node iptables -N "$FENCE-NODE" 2>/dev/null || in_node iptables -F "$FENCE-NODE"
  for cidr in "$KWOK_POD_CIDR" "$KWOK_NODE_IP/32"; do in_node iptables -A "$FENCE-NODE" -d "$cidr" -j REJECT; done
  local hook
  for hook in FORWARD OUTPUT; do
    in_node iptables -C "$hook" -j "$FENCE-NODE" 2>/dev/null || in_node iptables -I "$hook" 1 -j "$FENCE-NODE"
  done
  cat > "$NODE_DIR/cni/net.d/10-keelson.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "keelson",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {
      "type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
      "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
CNI
}

# stop_node_network: the node's namespace goes, and with it its link, CNI
# bridge and kube-proxy's rules (a power-off: the kernel's state is lost).
# This host's route to its pods stays, as on a real network.
stop_node_network() {
  ip netns del "$NETNS" 2>/dev/null || true
  ip link del "$VETH" 2>/dev/null || true
}

node_link_up() { ip link show "$VETH" 2>/dev/null | grep -q 'state UP'; }

# fence_up: one chain per hook, jumped to first, so that removing them
# removes exactly what we added.
fence_up() {
  fence_down
  iptables -N "$FENCE-FORWARD"
  iptables -A "$FENCE-FORWARD" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -A "$FENCE-FORWARD" -o "$BRIDGE" ! -i "$BRIDGE" -j DROP
  # Pods and nodes reach this host only at its bridge address, but answer
  # whatever it asked (a NodePort on 127.0.0.1 reaches a pod from there).
  iptables -N "$FENCE-INPUT"
  iptables -A "$FENCE-INPUT" -i "$BRIDGE" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  iptables -A "$FENCE-INPUT" -i "$BRIDGE" ! -d "$HOST_IP" -j DROP
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
  ip link show "$BRIDGE" up | grep -q UP && iptables -C FORWARD -j "$FENCE-FORWARD" 2>/dev/null || return 1
  local k
  for k in $(node_numbers); do node "$k"; node_link_up || return 1; done
}

stop_network() {
  local k
  for k in $(node_numbers); do node "$k"; stop_node_network; done
  ip link del "$BRIDGE" 2>/dev/null || true # the routes through it go with it
  ip route del unreachable "$CLUSTER_POD_CIDR" 2>/dev/null || true
  fence_down
  if [[ -f "$DIR/network/sysctl.saved" ]]; then
    local line; while read -r line; do sysctl -qw "$line" || true; done < "$DIR/network/sysctl.saved"
    rm -f "$DIR/network/sysctl.saved"
  fi
  rm -rf "$DIR/nodes"/*/cni/ipam
}
