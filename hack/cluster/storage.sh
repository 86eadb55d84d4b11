# Sourced by hack/cluster.sh: the default StorageClass (the controller-manager's
# host-path provisioner), and the default ServiceAccount every namespace needs.

start_storage() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" apply --server-side -f - >/dev/null <<SC
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
allowVolumeExpansion: true
SC
}

healthy_storage() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get storageclass standard \
    && "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" -n default get serviceaccount default
}
