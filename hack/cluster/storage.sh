# Sourced by hack/cluster.sh: the default StorageClass `keelson-local` and its
# provisioner, keelson-local-volumes (crates/testkit): a host folder per claim
# under DIR/volumes, as a `local` volume on the chosen node, so that a pod's
# fsGroup applies (uid 999 writes), data outlives pods, and claims can grow.
# Also waits for the default ServiceAccount every namespace needs.

start_storage() {
  (cd "$ROOT" && cargo build --quiet -p testkit --bin keelson-local-volumes) || die "cannot build keelson-local-volumes"
  cp "$ROOT/target/debug/keelson-local-volumes" "$DIR/keelson-local-volumes" # a rebuild must not pull it away
  KUBECONFIG="$DIR/components.kubeconfig" start_program local-volumes "$DIR/keelson-local-volumes" --root "$DIR/volumes"
  kubectl_admin apply --server-side -f - >/dev/null <<SC
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: keelson-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: keelson.dev/local-volume
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
SC
}

healthy_storage() {
  pid_alive local-volumes && kubectl_admin get storageclass keelson-local \
    && kubectl_admin -n default get serviceaccount default
}
