# Sourced by hack/cluster.sh: what every component's file uses.

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

pid_alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_ports() {
  local base
  if [[ -n "${KEELSON_CLUSTER_PORT_BASE:-}" ]]; then
    base="$KEELSON_CLUSTER_PORT_BASE"
  else
    # 10000-19999: below the kernel's ephemeral range (32768-60999), where a
    # component's own outgoing connection could take a port between this
    # check and its listen, and below the NodePort ranges.
    base=$(( 10000 + ($(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 450) * 20 ))
  fi
  local tries=0
  while :; do
    local busy=0 p
    for p in $(seq "$base" $((base + 19))); do port_in_use "$p" && { busy=1; break; }; done
    [[ $busy -eq 0 ]] && break
    tries=$((tries + 1)); [[ $tries -lt 50 ]] || die "no free block of ports near $base"
    base=$((base + 20))
  done
  cat > "$DIR/ports" <<PORTS
ETCD_PORT=$base
ETCD_PEER_PORT=$((base + 1))
API_PORT=$((base + 2))
KCM_PORT=$((base + 3))
SCHED_PORT=$((base + 4))
KWOK_PORT=$((base + 5))
KEELSON_METRICS_PORT=$((base + 7))
KEELSON_HEALTH_PORT=$((base + 8))
KUBELET_PORT=$((base + 10))
KUBELET_HEALTH_PORT=$((base + 11))
PROXY_HEALTH_PORT=$((base + 12))
PROXY_METRICS_PORT=$((base + 13))
DNS_READY_PORT=$((base + 14))
NETPOL_HEALTH_PORT=$((base + 15))
PORTS
}

# The real nodes' names, derived from the cluster folder so that two
# checkouts never share a bridge, subnet or runtime folder. The cluster's
# /24 is cut in four: the host link (this host at .1, node K at .10+K) and a
# /26 of pod addresses for each of up to three nodes.
node_settings() {
  local id=$(( $(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 250 + 1 ))
  # How many real nodes: as the running cluster was started, else KEELSON_REAL_NODES (3).
  REAL_NODES="${KEELSON_REAL_NODES:-$(cat "$DIR/real-nodes" 2>/dev/null || echo 3)}"
  [[ "$REAL_NODES" =~ ^[1-3]$ ]] || die "KEELSON_REAL_NODES must be 1, 2 or 3 (got $REAL_NODES)"
  CLUSTER_ID="$id"
  BRIDGE="keelson$id"
  CLUSTER_POD_CIDR="10.88.$id.0/24"
  HOST_IP="10.88.$id.1" # the host on the nodes' link: API bridge, CoreDNS
  RUN="/run/keelson-$id" # short paths for sockets; runtime state
  FENCE="KEELSON-$id"    # prefix of the iptables chains of the fence
  CGROUP_PREFIX="keelson$id-node" # each node's pods live under /sys/fs/cgroup/*/<prefix>K
}

node_numbers() { seq 1 "$REAL_NODES"; }

# node K: sets the names of real node K (1-3).
node() {
  local k="$1"
  [[ "$k" =~ ^[1-3]$ ]] && (( k <= REAL_NODES )) || die "no real node $k (nodes: $(node_numbers | sed 's/^/keelson-node-/' | paste -sd' '))"
  NODE_K="$k"
  NODE_NAME="keelson-node-$k"
  NODE_ZONE="zone-$(printf '%s' abc | cut -c"$k")"
  NODE_IP="10.88.$CLUSTER_ID.$((10 + k))"
  POD_CIDR="10.88.$CLUSTER_ID.$((64 * k))/26"
  POD_GATEWAY="10.88.$CLUSTER_ID.$((64 * k + 1))"
  NETNS="keelson$CLUSTER_ID-n$k"
  VETH="kl${CLUSTER_ID}n$k" # the host's end of the node's link
  NODE_DIR="$DIR/nodes/$k"  # the node's disk: runtime root, kubelet root, pod logs, IPAM
  NODE_RUN="$RUN/n$k"       # the node's /run: lost at power-off
  CGROUP_ROOT="$CGROUP_PREFIX$k"
  IN_NODE=(nsenter "--net=/run/netns/$NETNS" --) # the node's network; the host's mounts, so volumes reach the runtime
}

# node_of NAME|K: the node number of keelson-node-K or K.
node_of() {
  local k="${1#keelson-node-}"
  [[ "$k" =~ ^[1-3]$ ]] && (( k <= REAL_NODES )) || die "no real node $1 (nodes: $(node_numbers | sed 's/^/keelson-node-/' | paste -sd' '))"
  echo "$k"
}

in_node() { "${IN_NODE[@]}" "$@"; } # a program in the current node's network

kubectl_admin() { "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }

api() { # api PATH: GET on the API server with the admin token
  curl -sS --max-time 5 --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $(cat "$DIR/pki/admin.token")" "https://127.0.0.1:$API_PORT$1"
}

start() { # start NAME ARGS...: runs the control-plane binary NAME in the background
  local name="$1"; shift
  start_program "$name" "$BIN/$name" "$@"
}

start_program() { # start_program NAME PROGRAM ARGS...: logs to DIR/NAME.log, pid in DIR/NAME.pid
  local name="$1"; shift
  pid_alive "$name" && return
  setsid "$@" >>"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}

wait_until() { # wait_until SECONDS WHAT CMD...
  local limit="$1" what="$2"; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start > limit )); then
      log "timed out after ${limit}s waiting for $what; last log lines:"
      local c; for c in $(processes); do [[ -f "$DIR/$c.log" ]] && { echo "--- $c.log" >&2; tail -n 15 "$DIR/$c.log" >&2; }; done
      die "$what not ready"
    fi
    sleep 0.5
  done
}

stop_pid() { # stop_pid NAME...: SIGTERM the recorded pids together, then SIGKILL what is left after 10 s
  local name pid pids=() names=()
  for name in "$@"; do
    [[ -f "$DIR/$name.pid" ]] || continue
    pid="$(cat "$DIR/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; pids+=("$pid"); names+=("$name"); fi
    rm -f "$DIR/$name.pid"
  done
  local i j alive
  for i in $(seq 1 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && return 0
    sleep 0.1
  done
  for j in "${!pids[@]}"; do
    if kill -0 "${pids[$j]}" 2>/dev/null; then log "${names[$j]} did not stop in 10s; killing it"; kill -9 "${pids[$j]}" 2>/dev/null || true; fi
  done
}

# The real nodes' leftovers, found by where they live, never by name.
kill_cgroup_processes() { # kill_cgroup_processes ROOT: every process in a node's pod cgroups
  local round pids
  for round in 1 2 3 4 5; do
    pids="$(find "/sys/fs/cgroup/pids/$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true)"
    [[ -z "$pids" ]] && return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.2
  done
}

unmount_under() { # unmount_under DIR...: deepest first
  local prefix mounts=""
  for prefix in "$@"; do
    mounts+="$(awk -v p="$prefix/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo)"$'\n'
  done
  local m
  while read -r m; do
    if [[ -n "$m" ]]; then umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; fi
  done < <(sort -r <<<"$mounts")
}

remove_kubernetes_chains() { # what the kubelet and kube-proxy left in iptables (KUBE-*)
  local cmd table chain
  for cmd in iptables ip6tables; do
    for table in filter nat mangle; do
      "$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-A" && / -j KUBE-/' | while read -r _ rule; do
        eval "$cmd -t $table -D $rule" 2>/dev/null || true # eval: -S quotes comments
      done
      for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
        "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
        "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

remove_cgroups() { # remove_cgroups ROOT: a node's cgroups in every hierarchy, emptied by kill_cgroup_processes
  local root
  for root in /sys/fs/cgroup/*/"$1"; do
    if [[ -d "$root" ]]; then find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}

# make_cgroups ROOT: the node's cgroup in every hierarchy (the kubelet's
# cgroupRoot must exist); a new cpuset starts empty, so it takes its parent's.
make_cgroups() {
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    [[ -d "$hierarchy" ]] || continue
    mkdir -p "$hierarchy$1"
  done
  if [[ -d /sys/fs/cgroup/cpuset/$1 ]]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/$1/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/$1/cpuset.mems"
  fi
}
