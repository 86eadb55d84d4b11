# Sourced by hack/cluster.sh: what every component's file uses.

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

pid_alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_ports() {
  local base
  if [[ -n "${KEELSON_CLUSTER_PORT_BASE:-}" ]]; then
    base="$KEELSON_CLUSTER_PORT_BASE"
  else
    base=$(( 20000 + ($(printf '%s' "$DIR" | cksum | cut -d' ' -f1) % 2000) * 10 ))
  fi
  local tries=0
  while :; do
    local busy=0 p
    for p in $(seq "$base" $((base + 9))); do port_in_use "$p" && { busy=1; break; }; done
    [[ $busy -eq 0 ]] && break
    tries=$((tries + 1)); [[ $tries -lt 50 ]] || die "no free block of ports near $base"
    base=$((base + 10))
  done
  cat > "$DIR/ports" <<PORTS
ETCD_PORT=$base
ETCD_PEER_PORT=$((base + 1))
API_PORT=$((base + 2))
KCM_PORT=$((base + 3))
SCHED_PORT=$((base + 4))
KWOK_PORT=$((base + 5))
KEELSON_METRICS_PORT=$((base + 7))
KEELSON_HEALTH_PORT=$((base + 8))
PORTS
}

api() { # api PATH: GET on the API server with the admin token
  curl -sS --max-time 5 --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $(cat "$DIR/pki/admin.token")" "https://127.0.0.1:$API_PORT$1"
}

start() { # start NAME ARGS...: runs one component in the background, logging to DIR/NAME.log
  local name="$1"; shift
  pid_alive "$name" && return
  setsid "$BIN/$name" "$@" >>"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}

wait_until() { # wait_until SECONDS WHAT CMD...
  local limit="$1" what="$2"; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start > limit )); then
      log "timed out after ${limit}s waiting for $what; last log lines:"
      local c; for c in "${COMPONENTS[@]}"; do [[ -f "$DIR/$c.log" ]] && { echo "--- $c.log" >&2; tail -n 15 "$DIR/$c.log" >&2; }; done
      die "$what not ready"
    fi
    sleep 0.5
  done
}

stop_pid() { # stop_pid NAME: SIGTERM the recorded pid, then SIGKILL after 10 s
  local name="$1" pid
  [[ -f "$DIR/$name.pid" ]] || return 0
  pid="$(cat "$DIR/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/$name.pid"
}
