# Sourced by hack/cluster.sh: etcd, the control plane's store.

start_etcd() {
  start etcd --name default --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
}

healthy_etcd() { curl -sf "http://127.0.0.1:$ETCD_PORT/health"; }
