# Sourced by hack/cluster.sh: kube-apiserver. It enforces owner-reference
# permissions (as OpenShift does), audits what hack/cluster/pki.sh says, sends
# the pods of namespaces that ask for it to KWOK's nodes (PodNodeSelector,
# PodTolerationRestriction), and reaches the kubelet by its InternalIP only.

start_kube_apiserver() {
  start kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
    --client-ca-file "$DIR/pki/ca.crt" --token-auth-file "$DIR/pki/tokens.csv" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins OwnerReferencesPermissionEnforcement,PodNodeSelector,PodTolerationRestriction \
    --kubelet-preferred-address-types InternalIP \
    --kubelet-client-certificate "$DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$DIR/pki/apiserver-kubelet-client.key" \
    --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
    --service-node-port-range "${KEELSON_NODE_PORT_RANGE:-30000-32767}" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
    --audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 2 \
    --profiling=false --v 1
}

healthy_kube_apiserver() { [[ "$(api /readyz 2>/dev/null)" == "ok" ]]; }
