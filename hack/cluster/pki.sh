# Sourced by hack/cluster.sh: the cluster's certificates, admin token,
# kubeconfig, env file and audit policy.

make_pki() {
  local pki="$DIR/pki"
  [[ -f "$pki/ca.crt" ]] || make_control_plane_pki
  # Pods reach the API server as kubernetes.default.svc, at the Service's IP,
  # through this host's bridge address (hack/cluster/api-bridge.sh).
  local names="IP:127.0.0.1,IP:10.96.0.1,IP:$HOST_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default"
  names+=",DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  if [[ ! -f "$pki/apiserver.crt" ]] || ! grep -qF "subjectAltName=$names" "$pki/apiserver.ext"; then
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
      -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' "$names" > "$pki/apiserver.ext"
    openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  fi
  # The cluster's own components (controller-manager, scheduler, kwok, kube-proxy,
  # CoreDNS, the volume provisioner) act as a user of their own: the audit log's
  # reads by admin are then the tests' alone.
  if [[ ! -f "$pki/components.token" ]]; then
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pki/components.token"
    printf '%s,keelson-dev-components,components-uid,"system:masters"\n' "$(cat "$pki/components.token")" >> "$pki/tokens.csv"
  fi
  # The API server's identity when it calls a kubelet (logs, exec,
  # port-forward); each kubelet's own is made with it (hack/cluster/kubelet.sh).
  [[ -f "$pki/apiserver-kubelet-client.crt" ]] \
    || client_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
}

make_control_plane_pki() {
  local pki="$DIR/pki"
  command -v openssl >/dev/null || die "openssl is required"
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=keelson-dev-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pki/admin.token"
  printf '%s,admin,admin-uid,"system:masters"\n' "$(cat "$pki/admin.token")" > "$pki/tokens.csv"
}

client_cert() { # client_cert NAME SUBJECT: DIR/pki/NAME.{key,crt}, signed by the cluster's CA
  local pki="$DIR/pki" name="$1"
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$pki/client.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/client.ext" -out "$pki/$name.crt" 2>/dev/null
}

write_kubeconfig() {
  cat > "$DIR/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: keelson-dev
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$DIR/pki/admin.token")
contexts:
- name: keelson-dev
  context: {cluster: keelson-dev, user: admin}
current-context: keelson-dev
KC
  sed "s|token: .*|token: $(cat "$DIR/pki/components.token")|" "$DIR/kubeconfig" > "$DIR/components.kubeconfig"
  cat > "$DIR/env" <<ENV
# source this file to use the Keelson dev cluster
export KUBECONFIG="$DIR/kubeconfig"
export PATH="$BIN:\$PATH"
ENV
  # Writes at Metadata level: benchmarks count them per user. With
  # KEELSON_AUDIT_READS=1 (the default), also reads of ServiceAccounts and of
  # admin, whom the tests' operators impersonate their ServiceAccount through:
  # the RBAC audit test needs every verb they use. Benchmarks turn it off.
  local reads=""
  if [[ "${KEELSON_AUDIT_READS:-1}" == 1 ]]; then
    reads='- level: Metadata
  verbs: [get, list, watch]
  userGroups: ["system:serviceaccounts"]
- level: Metadata
  verbs: [get, list, watch]
  users: [admin]'
  fi
  cat > "$DIR/audit-policy.yaml" <<AUDIT
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
$reads
- level: None
  verbs: [get, list, watch]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
  users: [admin, keelson-dev-components, "system:kube-controller-manager", "system:kube-scheduler"]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
  userGroups: ["system:nodes"]
- level: Metadata
AUDIT
}
