# Sourced by hack/cluster.sh: each real node's kubelet (built with the
# control plane's release by hack/node-binaries.sh), in the node's network
# namespace. It reaches the API server through the API bridge on this host's
# bridge address, serves on the node's address (the API server reaches it by
# InternalIP) and accepts only clients with a certificate of the cluster's CA.
# Its pods' cgroups live under a root of the node's own.

start_kubelet() { local k; for k in $(node_numbers); do node "$k"; start_node_kubelet; done; }

start_node_kubelet() {
  local kd="$NODE_DIR/kubelet"
  mkdir -p "$kd/root" "$NODE_DIR/pod-logs"
  (( ${#kd} < 80 )) || die "cluster folder path too long for the kubelet's sockets: set KEELSON_CLUSTER_DIR to a shorter one"
  [[ -f "$DIR/pki/kubelet-$NODE_K.crt" ]] || client_cert "kubelet-$NODE_K" "/O=system:nodes/CN=system:node:$NODE_NAME"
  make_cgroups "$CGROUP_ROOT"
  cat > "$kd/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: keelson-dev
  cluster: {server: "https://$HOST_IP:$API_PORT", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: kubelet
  user: {client-certificate: "$DIR/pki/kubelet-$NODE_K.crt", client-key: "$DIR/pki/kubelet-$NODE_K.key"}
contexts:
- name: kubelet
  context: {cluster: keelson-dev, user: kubelet}
current-context: kubelet
KC
  # Pods with dnsPolicy Default get this file: cluster DNS, never the host's resolver.
  printf 'nameserver %s\n' "$HOST_IP" > "$kd/resolv.conf"
  # Node-lifecycle timings (status, lease) are the kubelet's defaults.
  cat > "$kd/config.yaml" <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: $KUBELET_HEALTH_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$DIR/pki/ca.crt"}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(CONTAINERD_SOCK)
clusterDNS: [$HOST_IP]
clusterDomain: cluster.local
resolvConf: $kd/resolv.conf
podCIDR: $POD_CIDR
# The node's /26 holds 61 pod addresses.
maxPods: 60
podLogsDir: $NODE_DIR/pod-logs
serializeImagePulls: false
# Secrets and ConfigMaps mounted as files follow their object within seconds (password rotation).
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
CFG
  start_program "kubelet-$NODE_K" "${IN_NODE[@]}" "$NODE_BIN/kubelet" --config "$kd/config.yaml" --kubeconfig "$kd/kubeconfig" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir "$kd/root" --cert-dir "$kd/pki" \
    --node-labels "type=real,keelson.dev/node=real,topology.kubernetes.io/zone=$NODE_ZONE" --v 1
}

healthy_kubelet() { local k; for k in $(node_numbers); do node "$k"; healthy_node_kubelet || return 1; done; }

healthy_node_kubelet() { # registered and Ready, then marked with its stand-in images
  # A kubelet that asked containerd's CRI too early ("server is not initialized yet") exits: again.
  if ! pid_alive "kubelet-$NODE_K"; then
    log "kubelet of $NODE_NAME exited while starting ($(tail -n 1 "$DIR/kubelet-$NODE_K.log" | cut -c1-160)); starting it again"
    start_node_kubelet
    return 1
  fi
  [[ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] || return 1
  [[ -z "${STAND_INS:-}" ]] || kubectl_admin annotate node "$NODE_NAME" --overwrite "keelson.dev/stand-in-images=$STAND_INS" >/dev/null
}

stop_kubelet() { stop_pid $(node_numbers | sed 's/^/kubelet-/'); }
