#!/usr/bin/env bash
# `make test`: lint, unit tests, and integration tests against a real local
# control plane. Reuses a running dev cluster, else starts one and stops it
# again at the end. Under CI=true nothing may skip: a missing control plane
# fails the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

start=$SECONDS
BIN="$(hack/k8s-binaries.sh)"
log "control-plane binaries: $BIN"
hack/postgres.sh ensure-installed

started_cluster=0
cleanup() {
  local rc=$?
  if [[ $started_cluster -eq 1 ]]; then
    hack/cluster.sh down
    # The cluster this run started must go without a trace (processes, mounts, rules).
    hack/cluster.sh leftovers || { log "cluster-down left the above behind"; rc=1; }
  fi
  exit "$rc"
}
trap cleanup EXIT
if hack/cluster.sh status 2>/dev/null | grep -q 'kwok profile'; then
  log "the running dev cluster has no real node (kwok profile); restarting it with one"
  hack/demo.sh stop-operator
  hack/cluster.sh down
fi
if hack/cluster.sh status >/dev/null 2>&1; then
  log "reusing the running dev cluster"
  # A demo operator watching every namespace would race the tests' own operators.
  log "stopping a demo operator if one runs (make demo starts it again)"
  hack/demo.sh stop-operator
else
  # Set first: a start that fails halfway is stopped as well.
  started_cluster=1
  hack/cluster.sh up
fi

# shellcheck disable=SC1091
source target/dev-cluster/env
export KEELSON_REQUIRE_CLUSTER=1 KEELSON_REQUIRE_POSTGRES=1
HELM="$(hack/helm.sh)"
export HELM
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"

log "lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
log "unit and integration tests"
# Kept whole, and each failure said again at the end: a long run's log is read from its tail.
output=target/test-output.log
if ! cargo test --workspace --no-fail-fast 2>&1 | tee "$output"; then
  log "failed; what each failing test said last (all of it: $output):"
  grep -E -A 12 "panicked at|^Error: " "$output" >&2 || true
  exit 101
fi
log "least privilege: every granted right was used by the suite (audit log)"
cargo test -p keelson --test rbac_audit -- --ignored
log "all tests passed in $((SECONDS - start))s"
