# Sourced by hack/cluster.sh: the real node's kubelet (built with the control
# plane's release by hack/node-binaries.sh). It serves on the node's bridge
# address, where the API server reaches it by InternalIP, and accepts only
# clients with a certificate of the cluster's CA.

start_kubelet() {
  local k="$DIR/kubelet"
  mkdir -p "$k/root" "$DIR/pod-logs"
  (( ${#k} < 80 )) || die "cluster folder path too long for the kubelet's sockets: set KEELSON_CLUSTER_DIR to a shorter one"
  cat > "$k/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: keelson-dev
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: kubelet
  user: {client-certificate: "$DIR/pki/kubelet.crt", client-key: "$DIR/pki/kubelet.key"}
contexts:
- name: kubelet
  context: {cluster: keelson-dev, user: kubelet}
current-context: kubelet
KC
  # Pods with dnsPolicy Default get this file: cluster DNS, never the host's resolver.
  printf 'nameserver %s\n' "$NODE_IP" > "$k/resolv.conf"
  cat > "$k/config.yaml" <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTH_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$DIR/pki/ca.crt"}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(CONTAINERD_SOCK)
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $k/resolv.conf
podCIDR: $POD_CIDR
maxPods: 110
podLogsDir: $DIR/pod-logs
serializeImagePulls: false
# Secrets and ConfigMaps mounted as files follow their object within seconds (password rotation).
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
CFG
  start_program kubelet "$NODE_BIN/kubelet" --config "$k/config.yaml" --kubeconfig "$k/kubeconfig" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir "$k/root" --cert-dir "$k/pki" \
    --node-labels "type=real,keelson.dev/node=real" --v 1
}

healthy_kubelet() { # registered and Ready, then marked with its stand-in images
  # A kubelet that asked containerd's CRI too early ("server is not initialized yet") exits: again.
  if ! pid_alive kubelet; then
    log "kubelet exited while starting ($(tail -n 1 "$DIR/kubelet.log" | cut -c1-160)); starting it again"
    start_kubelet
    return 1
  fi
  [[ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] \
    && kubectl_admin annotate node "$NODE_NAME" --overwrite "keelson.dev/stand-in-images=${STAND_INS:-}" >/dev/null
}
