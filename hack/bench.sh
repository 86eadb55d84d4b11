#!/usr/bin/env bash
# `make bench` / `make bench-quick`: the benchmark on a fresh local cluster of
# its own (target/bench-cluster), with a release build of the operator.
#   hack/bench.sh full     N=1000 WebApps, 100 drift trials, 100 MyDatabases; writes docs/benchmarks.md
#   hack/bench.sh quick    N=100, 20 drift trials, 20 MyDatabases, 20 s of rest
#   hack/bench.sh scale    N=100, 1000, 3000, 10000 (KEELSON_SCALE_N to choose); writes docs/bench-scale.md
#   hack/bench.sh ha       real PostgreSQL on the dev cluster's real node: KEELSON_HA_ROUNDS (10)
#                          failovers and switchovers; writes docs/bench/ha.md
# Extra arguments go to keelson-bench (e.g. --operator-cmd "...").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mode="${1:-quick}"; shift || true

if [[ "$mode" == ha ]]; then
  # Real pods need the real node: the dev cluster (started here if it is not running, and then
  # stopped again), not the KWOK-only bench cluster.
  started=0
  if hack/cluster.sh status 2>/dev/null | grep -q 'kwok profile'; then
    hack/demo.sh stop-operator
    hack/cluster.sh down
  fi
  # A demo operator watching every namespace would race the test's own.
  if hack/cluster.sh status >/dev/null 2>&1; then hack/demo.sh stop-operator; fi
  if ! hack/cluster.sh status >/dev/null 2>&1; then
    trap '[[ $started -eq 1 ]] && hack/cluster.sh down' EXIT
    started=1
    hack/cluster.sh up
  fi
  # shellcheck disable=SC1091
  source target/dev-cluster/env
  export KEELSON_REQUIRE_CLUSTER=1
  KEELSON_HA_ROUNDS="${KEELSON_HA_ROUNDS:-10}" KEELSON_HA_REPORT="$ROOT/docs/bench/ha.md" \
    cargo test -p keelson --test high_availability -- --nocapture
  echo "results: docs/bench/ha.md" >&2
  exit 0
fi
export KEELSON_CLUSTER_DIR="$ROOT/target/bench-cluster"
# KWOK only: thousands of pods on fake nodes, no real node beside them.
export KEELSON_CLUSTER_PROFILE=kwok
# Every WebApp has a NodePort Service: the default range (2768 ports) would cap N below 3000.
export KEELSON_NODE_PORT_RANGE=20000-32767
# The API server audits writes only here: auditing reads would slow what is measured.
export KEELSON_AUDIT_READS=0
if [[ "$mode" == scale ]]; then
  # A fake node holds 1500 pods: enough nodes for the largest N, and a spare.
  largest=$(tr ' ' '\n' <<<"${KEELSON_SCALE_N:-100 1000 3000 10000}" | sort -n | tail -1)
  export KEELSON_CLUSTER_NODES="${KEELSON_CLUSTER_NODES:-$(( largest / 1500 + 2 ))}"
fi

cargo build --release --quiet -p keelson -p bench
hack/cluster.sh down >/dev/null 2>&1 || true
# The audit log outlives the cluster: a run counts only its own requests.
rm -f "$KEELSON_CLUSTER_DIR"/audit*.log
hack/cluster.sh up
trap 'hack/cluster.sh down' EXIT
export KUBECONFIG="$KEELSON_CLUSTER_DIR/kubeconfig" KEELSON_AUDIT_LOG="$KEELSON_CLUSTER_DIR/audit.log"

scale() {
  # Each N in turn on the same cluster; a failure stops the series, and what finished is kept and reported.
  # Above KEELSON_SCALE_DIRECT_MAX (3000) the lower bound is not run: at 10,000 it alone takes about
  # 25 minutes here, and memory, writes and restart do not need it. KEELSON_SCALE_KEEP=1 keeps the
  # results of earlier runs, so that one N can be added to the report.
  local out=target/bench-scale stopped="" direct_max="${KEELSON_SCALE_DIRECT_MAX:-3000}"
  [[ "${KEELSON_SCALE_KEEP:-0}" == 1 ]] || rm -rf "$out"
  for n in ${KEELSON_SCALE_N:-100 1000 3000 10000}; do
    echo "[bench-scale] N=$n" >&2
    local direct=()
    (( n > direct_max )) && direct=(--no-direct)
    rm -rf "${out:?}/$n"
    if ! target/release/keelson-bench --n "$n" --drift-trials 20 --revert-trials 10 --databases 0 --idle-seconds 10 "${direct[@]}" --out "$out/$n" "$@"; then
      stopped="N=$n did not finish (see the output above); the smaller sizes are reported"
      break
    fi
  done
  target/release/keelson-bench --scale-report "$out" ${stopped:+--stopped "$stopped"}
  echo "summary: docs/bench-scale.md" >&2
}

case "$mode" in
  full) target/release/keelson-bench --n 1000 --drift-trials 100 --databases 100 --idle-seconds 60 --write-docs "$@" ;;
  quick) target/release/keelson-bench --n 100 --drift-trials 20 --revert-trials 10 --databases 20 --idle-seconds 20 "$@" ;;
  scale) scale "$@" ;;
  *) echo "usage: $0 full|quick|scale [keelson-bench args]" >&2; exit 2 ;;
esac
echo "results: target/bench/results.json" >&2
