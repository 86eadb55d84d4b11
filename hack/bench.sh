#!/usr/bin/env bash
# `make bench` / `make bench-quick`: the benchmark on a fresh local cluster of
# its own (target/bench-cluster), with a release build of the operator.
#   hack/bench.sh full     N=1000 WebApps, 100 drift trials, 100 MyDatabases; writes docs/benchmarks.md
#   hack/bench.sh quick    N=100, 20 drift trials, 20 MyDatabases, 20 s of rest
# Extra arguments go to keelson-bench (e.g. --operator-cmd "...").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mode="${1:-quick}"; shift || true
export KEELSON_CLUSTER_DIR="$ROOT/target/bench-cluster"
# KWOK only: thousands of pods on fake nodes, no real node beside them.
export KEELSON_CLUSTER_PROFILE=kwok
# The API server audits writes only here: auditing reads would slow what is measured.
export KEELSON_AUDIT_READS=0

cargo build --release --quiet -p keelson -p bench
hack/cluster.sh down >/dev/null 2>&1 || true
hack/cluster.sh up
trap 'hack/cluster.sh down' EXIT
export KUBECONFIG="$KEELSON_CLUSTER_DIR/kubeconfig" KEELSON_AUDIT_LOG="$KEELSON_CLUSTER_DIR/audit.log"

case "$mode" in
  full) target/release/keelson-bench --n 1000 --drift-trials 100 --databases 100 --idle-seconds 60 --write-docs "$@" ;;
  quick) target/release/keelson-bench --n 100 --drift-trials 20 --databases 20 --idle-seconds 20 "$@" ;;
  *) echo "usage: $0 full|quick [keelson-bench args]" >&2; exit 2 ;;
esac
echo "results: target/bench/results.json" >&2
