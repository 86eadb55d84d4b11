#!/usr/bin/env bash
# Keelson's PostgreSQL entry point: what MyDatabase pods and backup Jobs run.
# The operator ships this file in the `<name>-scripts` ConfigMap; the tests
# run the same file against a real PostgreSQL on 127.0.0.1.
#
#   keelson-postgres.sh start          pod entry point: waits for the role the operator
#                                      chose ($ORDERS_DIR/role), sets the data up for it
#                                      (new primary, clone, or rejoin after a failover),
#                                      then runs postgres and follows later orders
#   keelson-postgres.sh init-primary   initdb + app database, user and replication role
#   keelson-postgres.sh init-replica   pg_basebackup from $PRIMARY_HOST, standby config
#   keelson-postgres.sh apply-credentials   set the roles' passwords (primary) or the
#                                      streaming password (replica) from $CREDENTIALS_DIR
#   keelson-postgres.sh rejoin         a former primary's data made a replica of
#                                      $PRIMARY_HOST: pg_rewind, else a fresh clone
#   keelson-postgres.sh follow-orders  once: promote, step down, or set the synchronous
#                                      standbys as $ORDERS_DIR says (start runs it in a loop)
#   keelson-postgres.sh ready          readiness: the primary accepts connections; a
#                                      replica also streams from the primary
#   keelson-postgres.sh live           liveness: accepts connections, or still starting
#   keelson-postgres.sh backup         pg_dump of $APP_DB into $BACKUP_DIR (from a replica
#                                      where one answers), verified, then prune
#   keelson-postgres.sh prune          delete backups older than $RETENTION, never the newest
#   keelson-postgres.sh restore FILE   restore one backup into $APP_DB
#   keelson-postgres.sh restore-new    a new primary in $PGDATA from $RESTORE_BACKUP
#                                      (default: the newest) in $BACKUP_DIR
#
# Environment: PGDATA, PGPORT (5432), APP_DB, APP_USER, APP_PASSWORD,
# KEELSON_BIN (computes SCRAM verifiers), REPLICATION_USER, REPLICATION_PASSWORD (both passwords from files in
# CREDENTIALS_DIR instead, where it is set), PRIMARY_HOST, PRIMARY_PORT,
# BACKUP_DIR, BACKUP_SOURCE_HOST, TERMINATION_LOG, RETENTION (e.g. 7d, 12h, 4w), PGBIN (folder of the PostgreSQL
# binaries, default: from PATH), POD_NAME (for `start`), PGHOST (the local
# socket folder for `ready`, default /var/run/postgresql), ORDERS_DIR (the
# files the instance manager writes from the pod: `role`, `synchronous-standbys`,
# `hold`: a failover's token while this replica must not stream; `upstream`: the
# primary's pod address, which a replica streams from (else $PRIMARY_HOST); `fence`: why
# this server must not run, while the primary lease cannot be renewed; `ack`:
# this container's start, once the manager read the pod anew; `heartbeat`:
# written every second while the manager runs; `upstream-sslmode`: how the
# primary's certificate is checked), TLS_DIR (the server's certificate, key and
# CA, as mounted from `<name>-server`: TLS on, plaintext connections refused).
set -euo pipefail

PGPORT="${PGPORT:-5432}"
APP_DB="${APP_DB:-app}"
APP_USER="${APP_USER:-app}"
REPLICATION_USER="${REPLICATION_USER:-replicator}"
PRIMARY_PORT="${PRIMARY_PORT:-5432}"
BACKUP_DIR="${BACKUP_DIR:-/backups}"
bin() { if [[ -n "${PGBIN:-}" ]]; then echo "$PGBIN/$1"; else echo "$1"; fi; }
# A replica's connection to the primary: give up on an address that does not
# answer (a cut-off former primary that a Service still named for a moment)
# within seconds, not after the kernel's minutes of retries.
UPSTREAM_TIMEOUTS="connect_timeout=2 keepalives_idle=5 keepalives_interval=2 keepalives_count=2"
# Where a replica streams from: the primary's pod, as the operator names it
# ($ORDERS_DIR/upstream), not the -rw Service, which every node's kube-proxy
# moves in its own time (a cut-off former primary could confirm commits
# through it for a moment after a failover).
upstream_host() {
  local upstream=""
  [[ -z "${ORDERS_DIR:-}" ]] || upstream="$(cat "$ORDERS_DIR/upstream" 2>/dev/null)" || upstream=""
  printf '%s' "${upstream:-$PRIMARY_HOST}"
}
# TLS: the instance's certificate as mounted ($TLS_DIR), copied where PostgreSQL reads it (it
# accepts a key only its own user can read), with the CA replicas check their primary against.
tls_on() { [[ -n "${TLS_DIR:-}" ]]; }
tls_copy() { echo "$(dirname "$PGDATA")/keelson-tls"; }
# The mounted files differ from the copy PostgreSQL reads (renewed, or a copy that never was).
tls_changed() {
  local file
  for file in tls.crt tls.key ca.crt; do
    [[ -s "$TLS_DIR/$file" ]] || return 1
    cmp -s "$TLS_DIR/$file" "$(tls_copy)/$file" || return 0
  done
  return 1
}
install_tls() {
  local to file; to="$(tls_copy)"
  ( umask 077; mkdir -p "$to"
    for file in tls.crt tls.key ca.crt; do cat "$TLS_DIR/$file" > "$to/.$file.new" && mv -f "$to/.$file.new" "$to/$file"; done )
}
# PostgreSQL's settings for it (on the command line: the files' contents change, their names never).
ssl_options() {
  tls_on || return 0
  printf -- '-c ssl=on -c ssl_cert_file=%s/tls.crt -c ssl_key_file=%s/tls.key -c ssl_min_protocol_version=TLSv1.2' \
    "$(tls_copy)" "$(tls_copy)"
}
# A replica's options for its primary: the timeouts, and TLS checked against the database's CA
# (`prefer` only while the primary is a pod from before TLS, as the operator says).
upstream_options() {
  local mode=""
  tls_on || { printf '%s' "$UPSTREAM_TIMEOUTS"; return 0; }
  [[ -z "${ORDERS_DIR:-}" ]] || mode="$(cat "$ORDERS_DIR/upstream-sslmode" 2>/dev/null)" || mode=""
  printf '%s sslmode=%s sslrootcert=%s/ca.crt' "$UPSTREAM_TIMEOUTS" "${mode:-verify-ca}" "$(tls_copy)"
}
log() { printf '%s keelson-postgres: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }
need() { [[ -n "${!1:-}" ]] || { log "$1 is not set"; exit 2; }; }

# Passwords: the mounted Secrets' files (they follow rotation, and keep the
# passwords out of the long-running processes' environment), else the
# environment's (Jobs, tests). Read with `cat` (a path in its argv, not the password).
secret_file() {
  if [[ -n "${CREDENTIALS_DIR:-}" && -s "$CREDENTIALS_DIR/$1" ]]; then cat "$CREDENTIALS_DIR/$1"; else printf '%s' "$2"; fi
}
app_password() { secret_file password "${APP_PASSWORD:-}"; }
need_passwords() {
  [[ -n "$(app_password)" ]] || { log "no application password (CREDENTIALS_DIR/password or APP_PASSWORD)"; exit 2; }
  [[ -n "$(replication_password)" ]] || { log "no replication password (CREDENTIALS_DIR/replication-password or REPLICATION_PASSWORD)"; exit 2; }
}
# SQL quoting, in bash builtins: values reach psql on its standard input, never in an argv.
sql_literal() { local v="${1//\'/\'\'}"; printf "'%s'" "$v"; }
sql_ident() { local v="${1//\"/\"\"}"; printf '"%s"' "$v"; }
# A role's password for CREATE/ALTER ROLE: its SCRAM verifier, computed here by Keelson's binary
# ($KEELSON_BIN, the instance manager's), so that the password itself never reaches the server
# (nor a statement log). Without the binary (the script run on its own), the password.
password_sql() {
  local verifier
  [[ -n "${KEELSON_BIN:-}" ]] || { sql_literal "$1"; return 0; }
  verifier="$(printf '%s' "$1" | "$KEELSON_BIN" instance scram-verifier)" || { log "cannot compute a SCRAM verifier"; return 1; }
  sql_literal "$verifier"
}

# Seconds in a retention such as 7d, 12h or 4w.
retention_seconds() {
  local value="$1"
  [[ "$value" =~ ^([1-9][0-9]*)([hdw])$ ]] || { log "invalid RETENTION '$value' (want e.g. 7d, 12h, 4w)"; exit 2; }
  local n="${BASH_REMATCH[1]}"
  case "${BASH_REMATCH[2]}" in
    h) echo $((n * 3600)) ;;
    d) echo $((n * 86400)) ;;
    w) echo $((n * 604800)) ;;
  esac
}

init_primary() {
  need PGDATA; need_passwords
  if [[ -s "$PGDATA/PG_VERSION" ]]; then log "data folder already initialised"; return; fi
  log "initialising a new primary in $PGDATA"
  mkdir -p "$PGDATA"; chmod 700 "$PGDATA"
  # The superuser gets no password: it logs in only over the local socket, as the OS user postgres.
  "$(bin initdb)" -D "$PGDATA" --username=postgres --auth-local=peer --auth-host=scram-sha-256 \
    --encoding=UTF8 >/dev/null
  cat >> "$PGDATA/postgresql.conf" <<CONF
# Keelson
listen_addresses = '*'
wal_level = replica
max_wal_senders = 10
hot_standby = on
wal_keep_size = '256MB'
password_encryption = 'scram-sha-256'
# pg_rewind can bring a former primary back as a replica.
wal_log_hints = on
# After a failover, replicas find the new primary within a second or two.
wal_retrieve_retry_interval = '1s'
wal_receiver_timeout = '10s'
wal_sender_timeout = '10s'
CONF
  write_hba
  start_private
  {
    printf 'CREATE ROLE %s LOGIN PASSWORD %s;\n' "$(sql_ident "$APP_USER")" "$(password_sql "$(app_password)")"
    printf 'CREATE ROLE %s REPLICATION LOGIN PASSWORD %s;\n' "$(sql_ident "$REPLICATION_USER")" \
      "$(password_sql "$(replication_password)")"
  } | "$(bin psql)" -h "$PRIVATE_SOCKET" -p "$PGPORT" -U postgres -v ON_ERROR_STOP=1 -q
  "$(bin psql)" -h "$PRIVATE_SOCKET" -p "$PGPORT" -U postgres -v ON_ERROR_STOP=1 -q \
    -v app_user="$APP_USER" -v app_db="$APP_DB" -v repl_user="$REPLICATION_USER" <<'SQL'
CREATE DATABASE :"app_db" OWNER :"app_user";
-- Backups run as the app role: it reads every table, whoever created it (PostgreSQL 14+).
SELECT format('GRANT pg_read_all_data TO %I', :'app_user')
  WHERE current_setting('server_version_num')::int >= 140000 \gexec
-- What pg_rewind reads from the new primary, granted to the replication role.
GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO :"repl_user";
GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO :"repl_user";
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO :"repl_user";
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO :"repl_user";
-- ... and a checkpoint first, so that a just-promoted primary's control file names its timeline (PostgreSQL 15+).
SELECT format('GRANT pg_checkpoint TO %I', :'repl_user')
  WHERE current_setting('server_version_num')::int >= 150000 \gexec
SQL
  stop_private
  log "primary initialised"
}

# Who may connect, written before every start (a clone copies its source's):
# over the local socket only as one's own OS user (the pod's processes run as
# postgres); over the network never as the superuser, replication only as the
# replication role, everyone else with a SCRAM password.
# With TLS, only encrypted connections (hostssl): a plaintext one finds no line and is refused.
# The superuser over the network only with spec.superuserAccess (its password mounted).
write_hba() {
  local host=host superuser
  tls_on && host=hostssl
  superuser="host all postgres all reject"
  [[ -z "$(superuser_password)" ]] || superuser="$host all postgres all scram-sha-256"
  local partial; partial="$(mktemp "$PGDATA/.pg_hba.XXXXXX")"
  cat > "$partial" <<HBA
# Keelson writes this file before each start, and when superuser access changes.
local all all peer
$superuser
$host replication $REPLICATION_USER all scram-sha-256
$host all all all scram-sha-256
HBA
  chmod 600 "$partial"
  mv -f "$partial" "$PGDATA/pg_hba.conf"
}
superuser_password() { secret_file superuser-password ""; }

# A server on a socket of its own and no TCP, for setting up before anyone may connect.
start_private() {
  PRIVATE_SOCKET="$(mktemp -d)"
  "$(bin pg_ctl)" -D "$PGDATA" -o "-c listen_addresses='' -k $PRIVATE_SOCKET -p $PGPORT $(ssl_options)" -w start >/dev/null
}
stop_private() {
  "$(bin pg_ctl)" -D "$PGDATA" -m fast -w stop >/dev/null
  rmdir "$PRIVATE_SOCKET" 2>/dev/null || true
}

# The pod's termination message: what the operator shows in status.
report() { local to="${TERMINATION_LOG:-/dev/termination-log}"; if [[ -n "${TERMINATION_LOG:-}" || -w "$to" ]]; then printf '%s' "$1" > "$to"; fi; }
fail() { log "$1"; report "$1"; exit 1; }

# A new primary from a backup of another database: this database's own roles
# and passwords (init-primary), then the dump's data, owned by $APP_USER.
# $RESTORE_BACKUP names a file in $BACKUP_DIR (the source's backups volume);
# empty means the newest.
restore_new() {
  need PGDATA; need BACKUP_DIR
  local marker file available
  marker="$(dirname "$PGDATA")/keelson-restored-from"
  if [[ -f "$marker" ]]; then log "already restored from $(cat "$marker")"; return; fi
  if [[ -n "${RESTORE_BACKUP:-}" ]]; then
    file="$BACKUP_DIR/$RESTORE_BACKUP"
  else
    file="$(find "$BACKUP_DIR" -maxdepth 1 -name '*.dump' -printf '%p\n' | sort | tail -n 1)"
  fi
  if [[ -z "$file" || ! -f "$file" ]]; then
    available="$(find "$BACKUP_DIR" -maxdepth 1 -name '*.dump' -printf '%f\n' | sort | paste -sd ' ')"
    fail "spec.restoreFrom.backup ${RESTORE_BACKUP:-(the newest)}: no such backup in ${RESTORE_SOURCE:-$BACKUP_DIR} (it has: ${available:-none})"
  fi
  # An earlier attempt that did not finish starts over: nobody has used this data.
  rm -rf "$PGDATA"
  init_primary
  log "restoring $(basename "$file") into $APP_DB as $APP_USER"
  # As the application role, not the superuser: a dump is another database's
  # data and definitions, and what needs a superuser is refused. Only for this
  # server on a private socket (no TCP), the app role logs in without a password.
  cat > "$PGDATA/pg_hba.conf" <<HBA
local all postgres peer
local $APP_DB $APP_USER trust
HBA
  start_private
  if ! "$(bin pg_restore)" -h "$PRIVATE_SOCKET" -p "$PGPORT" -U "$APP_USER" -d "$APP_DB" \
      --no-owner --exit-on-error "$file"; then
    stop_private
    write_hba
    fail "pg_restore of $(basename "$file") from ${RESTORE_SOURCE:-$BACKUP_DIR} failed"
  fi
  stop_private
  write_hba
  basename "$file" > "$marker"
  report "restored $(basename "$file") from ${RESTORE_SOURCE:-$BACKUP_DIR}"
  log "restore complete"
}

init_replica() {
  need PGDATA; need PRIMARY_HOST; [[ -n "$(replication_password)" ]] || need REPLICATION_PASSWORD
  if [[ -s "$PGDATA/PG_VERSION" ]]; then log "data folder already initialised"; return; fi
  local upstream; upstream="$(upstream_host)"
  log "waiting for the primary $upstream:$PRIMARY_PORT"
  until upstream="$(upstream_host)" && "$(bin pg_isready)" -q -h "$upstream" -p "$PRIMARY_PORT"; do sleep 1; done
  # Credentials being rotated may not agree for a moment: wait, rather than fail half-cloned.
  wait_for_replication_login "host=$upstream port=$PRIMARY_PORT user=$REPLICATION_USER dbname=postgres $(upstream_options)"
  log "cloning the primary with pg_basebackup"
  mkdir -p "$PGDATA"; chmod 700 "$PGDATA"
  # -R writes these options into primary_conninfo too (no application_name:
  # the clone's stream must not count as a synchronous standby), and the
  # passfile's name, not the password (see write_replication_passfile).
  write_replication_passfile
  PGPASSFILE="$(replication_passfile)" "$(bin pg_basebackup)" -d "$(upstream_options)" -h "$upstream" -p "$PRIMARY_PORT" \
    -U "$REPLICATION_USER" -D "$PGDATA" -X stream -R --checkpoint=fast
  # Its slot once cloned (the clone itself streams through a temporary one): a slot the
  # replaced instance still holds would fail pg_basebackup; the WAL receiver waits for it.
  slot_in_config "$upstream"
  log "replica initialised; it streams from $upstream"
}

# Replaces this instance's data with a fresh clone, and says so beside it (the
# instance manager reports it; the operator records it with an Event).
reclone() {
  rm -rf "$PGDATA"
  init_replica
  local said; said="$(dirname "$PGDATA")/.keelson-rebuilt"
  printf '%s %s\n' "$(date -u +%s)" "$1" > "$said.partial"
  sync "$said.partial" 2>/dev/null || true
  mv "$said.partial" "$said"
}

# A former primary (its data is not a standby's) made a replica of
# $PRIMARY_HOST: pg_rewind undoes what it wrote after the new primary's
# timeline forked; when that cannot be done, a fresh clone replaces it.
rejoin() {
  need PGDATA; need PRIMARY_HOST; [[ -n "$(replication_password)" ]] || need REPLICATION_PASSWORD
  # 1: this replica stopped because it could not stream (see follow_orders_loop).
  local stalled="${1:-0}" marker upstream; marker="$(rejoin_marker)" upstream="$(upstream_host)"
  if [[ -f "$marker" ]]; then
    # The last rejoin never reached streaming: its data is not to be trusted.
    log "the previous rejoin did not stream; cloning $upstream afresh"
    rm -f "$marker"
    reclone "the previous rejoin did not reach streaming"
    return
  fi
  log "rejoining as a replica of $upstream"
  until upstream="$(upstream_host)" && "$(bin pg_isready)" -q -h "$upstream" -p "$PRIMARY_PORT"; do sleep 0.5; done
  local source="host=$upstream port=$PRIMARY_PORT user=$REPLICATION_USER dbname=postgres $(upstream_options)" output
  # A login that fails (a password being rotated) must not pass for a rewind that cannot be done:
  # that would throw this data away and clone.
  wait_for_replication_login "$source"
  # pg_rewind reads the source's timeline from its control file, which a promoted primary
  # updates at its next checkpoint: until then data with WAL the new primary never had passes
  # for "on the same timeline". The replication protocol tells the timeline at once; a rewind
  # is judged only once the control file agrees (asked for a checkpoint), else cloned afresh.
  local tries=0 ours theirs='' rewound=0 output=''
  ours="$(local_timeline)"
  while :; do
    # Each try with the current password (rotated meanwhile?), and bounded: a primary that
    # cannot answer or checkpoint now must not hold the rejoin.
    write_replication_passfile
    theirs="$(source_timeline "$source")"
    if [[ -n "$theirs" ]]; then
      # A checkpoint puts the promotion's timeline in its control file (asked again every 5 s).
      if (( tries % 5 == 0 )); then
        PGPASSFILE="$(replication_passfile)" PGCONNECT_TIMEOUT=5 PGOPTIONS='-c statement_timeout=10000' \
          "$(bin psql)" -X -q -d "$source" -c CHECKPOINT 2>/dev/null || (( tries > 0 )) \
          || log "could not ask $upstream for a checkpoint"
      fi
      # Nothing is written to this data before pg_rewind has compared the timelines: a failure
      # from here on is not tried again (the data may be half rewound), it is cloned afresh.
      output="$(PGPASSFILE="$(replication_passfile)" PGCONNECT_TIMEOUT=5 "$(bin pg_rewind)" -D "$PGDATA" \
          --source-server="$source" --write-recovery-conf 2>&1)" && rewound=1 || rewound=0
      # "Same timeline" is believed only once the source is shown to write no newer one.
      if ! [[ "$rewound" == 1 && "$output" == *"on the same timeline"* ]] \
          || [[ "$theirs" =~ ^[0-9]+$ && "$ours" =~ ^[0-9]+$ && "$theirs" -le "$ours" ]]; then
        break
      fi
      # Not trusted: no standby.signal stays behind for a restart to boot this data as a standby.
      rm -f "$PGDATA/standby.signal"
    fi
    if (( ++tries >= 30 )); then
      [[ -z "$output" ]] || sed 's/^/pg_rewind: /' <<<"$output" >&2
      log "no rewind could be judged after $tries tries ($upstream unreachable, or its control file behind its timeline ${theirs:-?}); cloning afresh"
      reclone "no rewind could be judged (the primary's control file lagged its timeline, or it could not be reached)"
      return
    fi
    (( tries == 1 )) && log "$upstream writes timeline ${theirs:-?}, its control file does not say so yet (or it did not answer): waiting for its checkpoint"
    sleep 1
  done
  if [[ "$rewound" == 1 ]]; then
    sed 's/^/pg_rewind: /' <<<"$output" >&2
    if [[ "$stalled" == 1 && "$output" == *"no rewind required"* ]]; then
      # Not diverged, yet it could not stream: the primary no longer has the WAL it needs.
      log "nothing to rewind, yet it could not stream: $upstream no longer has the WAL it needs; cloning afresh"
      reclone "the primary no longer had the WAL it needed"
      return
    fi
    # Also when no rewind was needed (same timeline): this data follows the primary now,
    # through its slot there.
    slot_in_config "$upstream"
    touch "$PGDATA/standby.signal" "$marker"
    log "rewound; it streams from $upstream"
  else
    sed 's/^/pg_rewind: /' <<<"$output" >&2
    log "pg_rewind failed; cloning $upstream afresh"
    reclone "its data could not be rewound onto the primary's timeline"
  fi
}

# The timeline in this (stopped) data folder's control file.
local_timeline() {
  "$(bin pg_controldata)" -D "$PGDATA" 2>/dev/null | sed -n "s/^Latest checkpoint's TimeLineID: *//p" || true
}

# The timeline SOURCE (a conninfo) writes on now, from the replication protocol (a promoted
# primary's control file says so only after its next checkpoint).
source_timeline() {
  PGPASSFILE="$(replication_passfile)" PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -d "$1 replication=true" \
    -c IDENTIFY_SYSTEM 2>/dev/null | cut -d '|' -f 2 || true
}

# Names this instance's slot on HOST in the configuration of a server that is down (the
# file's last setting wins, as pg_basebackup's and pg_rewind's own lines do).
slot_in_config() {
  printf 'primary_slot_name = %s\n' "$(sql_literal "$(ensure_slot "$1")")" >> "$PGDATA/postgresql.auto.conf"
}

# This instance's replication slot on its primary: keelson_<ordinal> (slot names are [a-z0-9_]).
slot_name() { [[ "${POD_NAME:-}" =~ -([0-9]+)$ ]] && echo "keelson_${BASH_REMATCH[1]}"; }

# Makes sure HOST has this instance's physical slot, so that it keeps the WAL
# this replica has not received, up to max_slot_wal_keep_size (see
# slot_wal_limit); one lost to that cap is made anew. None on a server without
# that cap (one started by an older script): there a slot could keep WAL without
# bound. Prints the slot's name, or nothing when there is none (no pod name, or
# HOST did not make it): streaming then goes without one, on wal_keep_size alone.
ensure_slot() {
  local host="$1" slot exists
  slot="$(slot_name)" || return 0
  # Not stopping on an error: another caller may have made the slot a moment ago.
  exists="$(PGPASSFILE="$(replication_passfile)" PGCONNECT_TIMEOUT=2 PGOPTIONS='-c statement_timeout=2000' \
      "$(bin psql)" -X -At -q -v slot="$slot" \
      -d "host=$host port=$PRIMARY_PORT user=$REPLICATION_USER dbname=postgres $(upstream_options)" \
      2>/dev/null <<'SQL'
\o /dev/null
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
  WHERE slot_name = :'slot' AND NOT active AND wal_status = 'lost';
SELECT pg_create_physical_replication_slot(:'slot', true)
  WHERE current_setting('max_slot_wal_keep_size') <> '-1'
    AND NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = :'slot');
\o
SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = :'slot');
SQL
  )" || true
  if [[ "$exists" != t ]]; then
    log "no replication slot on $host: streaming on wal_keep_size alone"
    return 0
  fi
  echo "$slot"
}

# The most WAL the slots may keep: a tenth of the data volume (at least 64MB),
# so that a replica that is gone for good cannot fill the primary's disk; past
# it the slot is lost and the replica, back, is cloned afresh.
slot_wal_limit() {
  local bytes
  bytes="$(df -B1 --output=size "$PGDATA" 2>/dev/null | tail -n 1 | tr -d ' ')"
  [[ "$bytes" =~ ^[0-9]+$ ]] || { echo 1024MB; return; }
  local mb=$(( bytes / 10 / 1048576 ))
  echo "$(( mb < 64 ? 64 : mb ))MB"
}

# A replica keeps no slots: those of its days as a primary would hold its WAL back.
drop_own_slots() {
  env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" -U postgres \
    -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                    WHERE slot_name LIKE 'keelson\_%' AND NOT active AND pg_is_in_recovery()" >/dev/null || true
}

# Until the replication role logs in to SOURCE (a conninfo) with the current password.
wait_for_replication_login() {
  local tries=0
  # Through the passfile, as pg_basebackup and pg_rewind then log in: a passfile libpq would not
  # read waits here, rather than fail a rewind and throw the data away.
  write_replication_passfile
  until PGPASSFILE="$(replication_passfile)" "$(bin psql)" -X -At -q -d "$1" -c 'SELECT 1' >/dev/null 2>&1; do
    (( tries++ % 30 == 0 )) && log "the replication role cannot log in to the primary yet (credentials being rotated?); waiting"
    sleep 1
  done
}

# Present from a rewind until the replica streams (follow_orders removes it).
rejoin_marker() { echo "$(dirname "$PGDATA")/keelson-rejoining"; }
# Set when a replica cannot follow the primary's timeline: the next start rewinds it.
rewind_flag() { echo "$(dirname "$PGDATA")/keelson-rewind"; }

# Set by `restart_server`: PostgreSQL stopped to come back in another role.
restart_marker() { echo "$(dirname "$PGDATA")/keelson-restart"; }
# Present from (re)starting until the server first answers: a clone, a rewind
# or a crash recovery may take long, and `live` must not have it killed.
starting_marker() { echo "${PGHOST:-/var/run/postgresql}/.keelson-starting"; }
# This container's start, for the instance manager to acknowledge (see prepare_for_role).
boot_file() { echo "${PGHOST:-/var/run/postgresql}/.keelson-boot"; }

# Stops PostgreSQL for `start` to bring it back in its new role within this
# container. Letting the container exit instead added the kubelet's restart
# back-off, which doubles with each restart: after five switchovers within ten
# minutes, a former primary stayed down for minutes before it rejoined.
restart_server() {
  touch "$(restart_marker)"
  "$(bin pg_ctl)" -D "$PGDATA" -m fast -w stop >/dev/null || true
}

# Waits for the role the operator chose for this pod (the instance manager
# writes it from the pod's label), then sets the data up for it.
# spec.postgresql.parameters (POSTGRESQL_PARAMETERS, checked by the operator) in
# a file postgresql.conf includes: written at every start, so a clone's or a
# rewind's copy of the source's never lingers. The command line's -c wins.
write_parameters() {
  [[ -f "$PGDATA/postgresql.conf" ]] || return 0
  printf '%s' "${POSTGRESQL_PARAMETERS:-}" > "$PGDATA/keelson-parameters.conf"
  grep -qx "include_if_exists = 'keelson-parameters.conf'" "$PGDATA/postgresql.conf" \
    || printf "\ninclude_if_exists = 'keelson-parameters.conf'\n" >> "$PGDATA/postgresql.conf"
}

prepare_for_role() {
  local role waited=0
  # The certificate first: every server below (a private one included) starts with TLS.
  if tls_on; then install_tls; fi
  # Fenced by the instance manager (it could not renew the primary lease), or the manager is
  # silent: no server until it can renew, and is heard from.
  local why
  until [[ ! -s "$ORDERS_DIR/fence" ]] && ! manager_silent; do
    why="$(cat "$ORDERS_DIR/fence" 2>/dev/null)" || why=""
    (( waited++ % 50 == 0 )) && log "fenced: ${why:-the instance manager is silent}; waiting"
    sleep 0.2
  done
  waited=0
  # Orders from before this container (a node powered off and on again keeps
  # its pods' folders) may be stale: a primary since replaced must not start
  # as one. The manager acknowledges this start once it has read the pod anew.
  until [[ "$(cat "$ORDERS_DIR/ack" 2>/dev/null)" == "$(cat "$(boot_file)")" ]]; do
    (( waited++ % 50 == 0 )) && log "waiting for the instance manager to read this pod's orders anew"
    sleep 0.2
  done
  waited=0
  # Fenced for maintenance (`kubectl keelson fence`): no server until unfenced.
  until [[ ! -s "$ORDERS_DIR/maintenance-fence" ]]; do
    (( waited++ % 150 == 0 )) && log "$(cat "$ORDERS_DIR/maintenance-fence" 2>/dev/null); waiting to be unfenced"
    sleep 0.2
  done
  waited=0
  until role="$(cat "$ORDERS_DIR/role" 2>/dev/null)" && [[ "$role" == primary || "$role" == replica ]]; do
    (( waited++ % 50 == 0 )) && log "waiting for the operator to choose this pod's role ($ORDERS_DIR/role)"
    sleep 0.2
  done
  log "role: $role"
  if [[ "$role" == replica && -s "$ORDERS_DIR/hold" ]]; then
    # Held for a failover: no clone, rewind or streaming while the old primary
    # may still run. Data starts without an upstream, to give its final
    # position; an empty volume waits until the hold is lifted.
    if [[ -s "$PGDATA/PG_VERSION" && ! -f "$(rewind_flag)" ]]; then
      # A former primary's data too (a database re-created over its volumes): as a standby it
      # replays what it has and stops there; chosen, it is promoted (a new timeline), else rewound.
      touch "$PGDATA/standby.signal"
      [[ ! -f "$PGDATA/postgresql.auto.conf" ]] || sed -i '/^primary_conninfo/d' "$PGDATA/postgresql.auto.conf"
    else
      until [[ ! -s "$ORDERS_DIR/hold" ]]; do
        (( waited++ % 50 == 0 )) && log "held for a failover, with no replica data to offer: waiting for the hold to be lifted"
        sleep 0.2
      done
      role="$(cat "$ORDERS_DIR/role")"
      log "hold lifted; role: $role"
    fi
  fi
  if [[ "$role" == primary ]]; then
    # A replica chosen while it was down starts as a replica and is promoted
    # (follow_orders: pg_promote, a new timeline); data that was a replica's
    # never serves as the primary on the old primary's timeline.
    [[ -s "$PGDATA/PG_VERSION" ]] || init_primary
  elif [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    init_replica
  elif [[ -f "$(rewind_flag)" ]]; then
    rm -f "$(rewind_flag)"
    rejoin 1
  elif [[ ! -f "$PGDATA/standby.signal" ]]; then
    rejoin
  fi
  write_hba
  # As the official image does: a volume's group permissions must not stop the server.
  chmod 700 "$PGDATA"
}

# One PostgreSQL per data folder. PostgreSQL's own lock (postmaster.pid) does
# not see a server in another container: after a forced deletion, the kubelet
# may start the pod's successor while the old container's server still runs on
# the same volume, and two servers on one data folder lose commits. This lock,
# on the volume, is inherited by the server and every backend: it is free only
# once all of them have exited (the script's own loops do not take it).
hold_data_lock() {
  local waited=0
  exec 9>>"$(dirname "$PGDATA")/.keelson-data-lock"
  touch "$(starting_marker)"
  until flock -n 9; do
    (( waited++ % 10 == 0 )) && log "another PostgreSQL still runs on this data folder (a former container of this pod); waiting for it to exit"
    sleep 1
  done
}

# The pod's entry point: PostgreSQL in the role the operator chose, started
# again in place when the orders change its role (see `restart_server`); any
# other exit ends the container, with PostgreSQL's status.
start() {
  need POD_NAME; need ORDERS_DIR
  rm -f "$(restart_marker)"
  local server="" status stopping="" following=""
  # The kubelet's SIGTERM goes to this shell (the container's first process):
  # passed on as SIGINT, PostgreSQL's fast shutdown. Its SIGTERM (smart) would
  # let open sessions commit until the grace period ends, while a replica may be
  # promoted; fast ends them at once and sends the last WAL to the replicas.
  trap 'stopping=1; [[ -z "$server" ]] || kill -INT "$server" 2>/dev/null || true' TERM INT
  echo "$(date +%s%N)-$$" > "$(boot_file)"
  hold_data_lock
  while :; do
    touch "$(starting_marker)"
    prepare_for_role
    [[ -z "$stopping" ]] || exit 143
    # cluster_name names a replica to its primary (the WAL receiver's
    # application_name): pg_stat_replication and the instance reports go by pod.
    # Slots: one per replica (16 instances at most) and pg_basebackup's temporary ones.
    # Replication connections that went silent (a partition, a powered-off
    # node) are dropped after 5 s: a cut-off primary sees its replicas gone,
    # and fences itself, before the operator takes its lease for expired.
    write_parameters
    # shellcheck disable=SC2046 # ssl_options is words by design
    "$(bin postgres)" -D "$PGDATA" -p "$PGPORT" -c cluster_name="$POD_NAME" \
      -c wal_sender_timeout=5s -c wal_receiver_timeout=5s -c max_slot_wal_keep_size="$(slot_wal_limit)" \
      -c max_replication_slots=32 \
      $(ssl_options) &
    server=$!
    if [[ -z "$following" ]]; then
      following=1
      follow_orders_loop 9>&- &
      watch_credentials 9>&- &
    fi
    status=0
    # A trapped signal interrupts `wait` while the server still runs: wait again.
    while kill -0 "$server" 2>/dev/null; do
      if wait "$server"; then status=0; else status=$?; fi
    done
    server=""
    if [[ -n "$stopping" || ! -f "$(restart_marker)" ]]; then exit "$status"; fi
    rm -f "$(restart_marker)"
    log "PostgreSQL stopped on the orders (another role, or a rewind): starting it again"
  done
}

# The instance manager has written its heartbeat before, and not for 5 s:
# it is down or stuck, and nothing would fence this server if it were cut off.
manager_silent() {
  local beat="$ORDERS_DIR/heartbeat" written
  written="$(stat -c %Y "$beat" 2>/dev/null)" || return 1
  (( $(date +%s) - written > ${MANAGER_SILENT_SECONDS:-5} ))
}

# Stops a fenced server. Its orders may be stale by the time it may run again (another
# instance promoted meanwhile): the acknowledgement goes, so that it starts only once the
# manager has read the pod anew (which a manager still cut off cannot do).
fence_server() {
  rm -f "$ORDERS_DIR/ack"
  restart_server
}

# The operator's later orders, once PostgreSQL runs: promote a replica chosen
# as primary; stop a primary that was stepped down (`start` rejoins it as a
# replica: never two primaries); set the
# primary's synchronous standbys. Replicas stream through -rw, which only
# ever selects the chosen primary: a former primary whose processes outlive
# its pod (a forced deletion) can never be streamed from again.
follow_orders() {
  local socket="${PGHOST:-/var/run/postgresql}" role wanted state in_recovery streaming current upstream hold host
  local senders sslmode
  # A hung server must not hang the orders: give up on a connection after a few seconds.
  local sql=(env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "$socket" -p "$PGPORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
  role="$(cat "$ORDERS_DIR/role" 2>/dev/null)" || return 0
  hold="$(cat "$ORDERS_DIR/hold" 2>/dev/null)" || hold=""
  # The fence first, before any SQL: a server too busy or stuck to answer must stop all the same.
  if [[ -s "$ORDERS_DIR/fence" ]] && "$(bin pg_ctl)" -D "$PGDATA" status >/dev/null 2>&1; then
    log "fenced: $(cat "$ORDERS_DIR/fence"); stopping until the lease is renewed"
    fence_server
    return 0
  fi
  if [[ -s "$ORDERS_DIR/maintenance-fence" ]] && "$(bin pg_ctl)" -D "$PGDATA" status >/dev/null 2>&1; then
    log "$(cat "$ORDERS_DIR/maintenance-fence"): stopping PostgreSQL (fast)"
    fence_server
    return 0
  fi
  # One look at the server answers every question below.
  state="$("${sql[@]}" -F '|' -c "SELECT pg_is_in_recovery(),
      EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'),
      current_setting('synchronous_standby_names'),
      current_setting('primary_conninfo') <> '',
      coalesce(substring(current_setting('primary_conninfo') from 'host=''?([^'' ]+)'), ''),
      coalesce(substring(current_setting('primary_conninfo') from 'sslmode=''?([^'' ]+)'), ''),
      (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming')" 2>/dev/null)" || return 0
  IFS='|' read -r in_recovery streaming current upstream host sslmode senders <<<"$state"
  rm -f "$(starting_marker)"
  # A primary with no replica streaming from it and its manager silent: the manager's
  # fence could not come, so it stops (as when fenced) until the manager is back.
  if [[ "$in_recovery" == f && "$senders" == 0 ]] && manager_silent; then
    log "fenced: the instance manager has not been heard from for over ${MANAGER_SILENT_SECONDS:-5}s; stopping until it is back"
    fence_server
    return 0
  fi
  STREAMING="$streaming" IN_RECOVERY="$in_recovery" HOLDING=""
  if [[ "$in_recovery" == t && -n "$hold" ]]; then
    # A failover's hold: let go of the primary, so that its position is final
    # and a primary that still runs can have no more commits confirmed here.
    HOLDING=1
    if [[ "$upstream" == t ]]; then
      "${sql[@]}" >/dev/null <<'SQL' && log "holding for the failover ($hold): stopped streaming"
ALTER SYSTEM SET primary_conninfo = '';
SELECT pg_reload_conf();
SQL
    fi
  elif [[ "$in_recovery" == t && "$role" == replica && "$upstream" == f ]]; then
    log "hold lifted: streaming again"
    follow "$(upstream_host)" || true
  elif [[ "$in_recovery" == t && "$role" == replica && "$host" != "$(upstream_host)" ]]; then
    # A new primary, or its pod's new address.
    follow "$(upstream_host)" || true
  elif [[ "$in_recovery" == t && "$role" == replica && "$upstream" == t ]] && tls_on \
      && [[ " $(upstream_options) " != *" sslmode=$sslmode "* ]]; then
    # The operator changed how the primary's certificate is checked (its pod now presents one).
    follow "$(upstream_host)" || true
  fi
  if [[ "$role" == primary && "$in_recovery" == t ]]; then
    log "chosen as the primary: promoting"
    # The checkpoint puts the new timeline in the control file at once: a
    # former primary's pg_rewind reads it from there.
    "${sql[@]}" -c 'SELECT pg_promote(true, 30)' -c 'CHECKPOINT' >/dev/null || log "promotion failed"
  elif [[ "$role" == replica && "$in_recovery" == f ]]; then
    log "no longer the primary: stopping; it comes back as a replica"
    restart_server
    return 0
  elif [[ "$streaming" == t && -f "$(rejoin_marker)" ]]; then
    rm -f "$(rejoin_marker)"
    drop_own_slots
    log "rejoined: streaming"
  fi
  wanted="$(cat "$ORDERS_DIR/synchronous-standbys" 2>/dev/null)" || return 0
  if [[ "$wanted" != "$current" ]]; then
    "${sql[@]}" -v value="$wanted" >/dev/null <<'SQL' && log "synchronous_standby_names = '$wanted'"
ALTER SYSTEM SET synchronous_standby_names = :'value';
SELECT pg_reload_conf();
SQL
  fi
}

# The replication password: the mounted Secret's (it follows rotation), else the environment's.
replication_password() { secret_file replication-password "${REPLICATION_PASSWORD:-}"; }

# The replication password as the WAL receiver reads it: a passfile beside the
# data folder (0600), named by primary_conninfo's passfile=, never its
# password=: the server logs every new primary_conninfo in full. Read at each
# connection, so a rotated password is taken at the next one, without cutting
# the stream that runs.
replication_passfile() { echo "$(dirname "$PGDATA")/keelson-replication.pgpass"; }
write_replication_passfile() {
  local file escaped line
  need PGDATA
  file="$(replication_passfile)" escaped="$(replication_password)"
  escaped="${escaped//\\/\\\\}" escaped="${escaped//:/\\:}"
  line="*:*:*:$REPLICATION_USER:$escaped"
  # libpq ignores a passfile others may read: its mode is set again each time (a volume re-permissioned).
  [[ -f "$file" && "$(cat "$file")" == "$line" ]] && { chmod 600 "$file"; return 0; }
  ( umask 077; printf '%s\n' "$line" > "$file.partial" ) && mv "$file.partial" "$file"
}

held_for_failover() { [[ -n "${ORDERS_DIR:-}" && -s "$ORDERS_DIR/hold" ]]; }

# Streams from HOST from now on (the WAL receiver reconnects on reload).
follow() {
  local host="$1" conninfo
  # Held for a failover: no streaming until the operator lifts the hold (a
  # credentials change or a reconnect must not undo it).
  if held_for_failover; then log "held for a failover: not following $host yet"; return 1; fi
  write_replication_passfile || { log "could not write the replication passfile"; return 1; }
  local slot; slot="$(ensure_slot "$host")"
  # Again: making the slot took a round trip, in which a failover may have asked for a hold.
  if held_for_failover; then log "held for a failover: not following $host yet"; return 1; fi
  conninfo="host=$host port=$PRIMARY_PORT user=$REPLICATION_USER application_name=${POD_NAME:-replica}"
  conninfo+=" passfile=$(replication_passfile) $(upstream_options)"
  printf 'ALTER SYSTEM SET primary_conninfo = %s;\nALTER SYSTEM SET primary_slot_name = %s;\nSELECT pg_reload_conf();\n' \
    "$(sql_literal "$conninfo")" "$(sql_literal "$slot")" \
    | env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" -U postgres \
      -d postgres -v ON_ERROR_STOP=1 >/dev/null || { log "could not follow $host"; return 1; }
  drop_own_slots
  log "streams from $host${slot:+ through slot $slot}"
}

# New orders are acted on within ORDERS_POLL; otherwise the server is looked
# at once a second (each look is a connection, a backend for the server).
follow_orders_loop() {
  local stalled_since="" kicked="" seen="" orders looked=-1
  while sleep "${ORDERS_POLL:-0.2}"; do
    orders="$(cat "$ORDERS_DIR/role" "$ORDERS_DIR/synchronous-standbys" "$ORDERS_DIR/hold" "$ORDERS_DIR/upstream" "$ORDERS_DIR/upstream-sslmode" "$ORDERS_DIR/fence" "$ORDERS_DIR/maintenance-fence" 2>/dev/null || true)"
    [[ "$orders" != "$seen" || $SECONDS -ne $looked ]] || continue
    seen="$orders" looked=$SECONDS STREAMING="" IN_RECOVERY=""
    follow_orders || true
    # A replica that replayed past the point where the new primary's timeline
    # forked cannot stream from it, ever: after a while without streaming,
    # while the primary answers, it stops to be rewound (see start). A
    # primary, or a server not up yet, counts as following.
    if [[ "$IN_RECOVERY" != t || "$STREAMING" != f || -n "$HOLDING" ]]; then stalled_since="" kicked=""; continue; fi
    stalled_since="${stalled_since:-$SECONDS}"
    # The WAL receiver does not give up connecting to an address that never
    # answers (a former primary's, cut off, that -rw still named for a moment):
    # after a few seconds without streaming, start it again.
    if [[ -z "$kicked" ]] && (( SECONDS - stalled_since >= ${KICK_SECONDS:-4} )) \
        && "$(bin pg_isready)" -q -h "$(upstream_host)" -p "$PRIMARY_PORT"; then
      kicked=1
      log "not streaming for $((SECONDS - stalled_since))s while $(upstream_host) answers: reconnecting"
      env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" -U postgres \
        -d postgres -c "ALTER SYSTEM SET primary_conninfo = ''" -c 'SELECT pg_reload_conf()' >/dev/null || true
      sleep 0.5
      follow "$(upstream_host)" || true
    fi
    if (( SECONDS - stalled_since >= ${STALL_SECONDS:-20} )) \
        && "$(bin pg_isready)" -q -h "$(upstream_host)" -p "$PRIMARY_PORT"; then
      log "not streaming for $((SECONDS - stalled_since))s while $(upstream_host) answers: stopping to rewind"
      touch "$(rewind_flag)"
      restart_server
      stalled_since=""
    fi
  done
}

# Password rotation without restarts: the credentials Secret is mounted as
# files ($CREDENTIALS_DIR), which follow it; when they change, the primary
# sets the roles' passwords and a replica the password it streams with.
watch_credentials() {
  local dir="${CREDENTIALS_DIR:-}" applied="" current mode
  [[ -n "$dir" && -d "$dir" ]] || return 0
  while sleep "${CREDENTIALS_POLL:-3}"; do
    # A renewed certificate: copied and reloaded, open sessions untouched, new ones get it.
    if tls_on && tls_changed; then
      if install_tls && env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "${PGHOST:-/var/run/postgresql}" \
          -p "$PGPORT" -U postgres -d postgres -c 'SELECT pg_reload_conf()' >/dev/null; then
        log "the server certificate changed: reloaded"
      fi
    fi
    # A replica holding for a failover must not start streaming again (follow_orders lifts the hold).
    [[ -s "$ORDERS_DIR/hold" ]] && continue
    current="$( { cat "$dir/password" "$dir/replication-password" && { cat "$dir/superuser-password" 2>/dev/null || true; }; } \
      2>/dev/null | sha256sum)" || continue
    # Applied per role: a replica applies the passwords to its streaming, and
    # once promoted it must set them on the roles (a rotation its former
    # primary had not applied yet would otherwise lock every replica out).
    mode="$(env PGCONNECT_TIMEOUT=5 "$(bin psql)" -X -At -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" \
      -U postgres -d postgres -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" || continue
    [[ "$current $mode" == "$applied" ]] && continue
    apply_credentials "$dir" && applied="$current $mode"
  done
}

apply_credentials() {
  local dir="$1" socket="${PGHOST:-/var/run/postgresql}" in_recovery hba
  local sql=("$(bin psql)" -X -At -q -h "$socket" -p "$PGPORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
  in_recovery="$("${sql[@]}" -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" || return 1
  # Superuser access turned on or off: every instance's pg_hba.conf follows, reloaded.
  if [[ -n "${PGDATA:-}" ]]; then
    hba="$(cat "$PGDATA/pg_hba.conf" 2>/dev/null)" || hba=""
    write_hba
    if [[ "$(cat "$PGDATA/pg_hba.conf")" != "$hba" ]]; then
      "${sql[@]}" -c 'SELECT pg_reload_conf()' >/dev/null || return 1
      log "pg_hba.conf rewritten (superuser access $([[ -n "$(superuser_password)" ]] && echo on || echo off))"
    fi
  fi
  if [[ "$in_recovery" == f ]]; then
    # Not waiting for a synchronous standby: one that must log in with the new
    # password to stream (two instances, after a switchover) would never confirm
    # it. Each new primary sets the passwords again from the mounted Secret.
    {
      printf 'BEGIN;\nSET LOCAL synchronous_commit = local;\n'
      printf 'ALTER ROLE %s PASSWORD %s;\n' "$(sql_ident "$APP_USER")" "$(password_sql "$(cat "$dir/password")")"
      printf 'ALTER ROLE %s PASSWORD %s;\n' "$(sql_ident "$REPLICATION_USER")" \
        "$(password_sql "$(cat "$dir/replication-password")")"
      # No network login for the superuser unless spec.superuserAccess mounts its password.
      if [[ -n "$(superuser_password)" ]]; then
        printf 'ALTER ROLE postgres PASSWORD %s;\n' "$(password_sql "$(superuser_password)")"
      else
        printf 'ALTER ROLE postgres PASSWORD NULL;\n'
      fi
      printf 'COMMIT;\n'
    } | "${sql[@]}" || return 1
  else
    local conninfo host
    # The new password for the next connection; the stream that runs goes on.
    write_replication_passfile || return 1
    conninfo="$("${sql[@]}" -c "SELECT current_setting('primary_conninfo')")" || return 1
    # Already reading the passfile. Otherwise (as pg_basebackup -R or pg_rewind wrote it, with
    # the password in it): once, to the passfile.
    [[ "$conninfo" == *"passfile="* ]] && return 0
    host="$("${sql[@]}" -c "SELECT substring(current_setting('primary_conninfo') from 'host=''?([^'' ]+)')")" || return 1
    follow "${host:-$(upstream_host)}" || return 1
  fi
  if [[ "$in_recovery" == f ]]; then log "credentials applied to the roles"; else log "credentials applied to streaming"; fi
}

# Liveness: the server responds (accepting, or starting or stopping), or it is still starting (set up
# for its role, recovering): long work is not killed.
live() {
  [[ -f "$(starting_marker)" || -f "$(restart_marker)" ]] && exit 0
  # 0: accepting; 1: rejecting, i.e. starting up or shutting down (a stepped-down primary's fast
  # shutdown waits for its standbys): alive. 2: no response at all (hung): not.
  local status=0
  "$(bin pg_isready)" -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" || status=$?
  [[ $status -ne 2 ]]
}

# Ready means what clients expect of the Services: the primary accepts
# connections; a replica also streams from the primary (a replica that only
# started, or lost its primary, serves stale reads and is not ready).
ready() {
  "$(bin pg_isready)" -q -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" || exit 1
  local state
  state="$("$(bin psql)" -X -At -h "${PGHOST:-/var/run/postgresql}" -p "$PGPORT" -U postgres -d postgres -c \
    "SELECT CASE WHEN NOT pg_is_in_recovery() THEN 'primary'
                 WHEN EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming') THEN 'streaming'
                 ELSE 'not-streaming' END")" || exit 1
  [[ "$state" == primary || "$state" == streaming ]] || { log "not ready: replica is $state"; exit 1; }
}

prune() {
  need RETENTION
  local keep now cutoff newest file stamp epoch
  keep="$(retention_seconds "$RETENTION")"
  now="$(date -u +%s)"
  cutoff=$((now - keep))
  # Names carry their UTC time: <db>-YYYYmmddTHHMMSSZ.dump; sorted by name = by time.
  newest="$(find "$BACKUP_DIR" -maxdepth 1 -name "*.dump" -printf '%f\n' | sort | tail -n 1)"
  while IFS= read -r file; do
    [[ -n "$file" && "$file" != "$newest" ]] || continue
    stamp="${file%.dump}"; stamp="${stamp##*-}"
    [[ "$stamp" =~ ^([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})Z$ ]] || continue
    epoch="$(date -u -d "${BASH_REMATCH[1]}-${BASH_REMATCH[2]}-${BASH_REMATCH[3]} ${BASH_REMATCH[4]}:${BASH_REMATCH[5]}:${BASH_REMATCH[6]}" +%s)"
    if (( epoch < cutoff )); then
      rm -f "$BACKUP_DIR/$file"
      log "pruned $file (older than $RETENTION)"
    fi
  done < <(find "$BACKUP_DIR" -maxdepth 1 -name "*.dump" -printf '%f\n' | sort)
}

# A logical backup (pg_dump -Fc: restorable into any later server, one file,
# verified by reading its table of contents) from a replica where one answers
# ($BACKUP_SOURCE_HOST), else from the primary. Its name and size go to the
# pod's termination message, where the operator reads them for status.
# pg_dump -Fc of $APP_DB from HOST into FILE.
# Dumps are readable by the backup's own user only (0600): they hold every row.
dump_to() {
  ( umask 077; PGPASSWORD="$APP_PASSWORD" "$(bin pg_dump)" -h "$1" -p "$PRIMARY_PORT" -U "$APP_USER" -d "$APP_DB" -Fc -f "$2" )
}

backup() {
  need PRIMARY_HOST; need APP_PASSWORD; need RETENTION
  retention_seconds "$RETENTION" >/dev/null
  mkdir -p "$BACKUP_DIR"
  local stamp target source="$PRIMARY_HOST"
  stamp="$(date -u +%Y%m%dT%H%M%SZ)"
  target="$BACKUP_DIR/$APP_DB-$stamp.dump"
  # A NetworkPolicy engine admits a new pod's address a moment after it starts: up to 60 tries
  # (about two and a half minutes when nothing answers) for the primary to answer at all
  # (pg_isready: 2 is no answer).
  local tries=0
  until "$(bin pg_isready)" -q -t 2 -h "$PRIMARY_HOST" -p "$PRIMARY_PORT"; [[ $? -ne 2 ]] || (( ++tries > 60 )); do
    sleep 0.5
  done
  if [[ -n "${BACKUP_SOURCE_HOST:-}" ]] && "$(bin pg_isready)" -q -t 5 -h "$BACKUP_SOURCE_HOST" -p "$PRIMARY_PORT"; then
    source="$BACKUP_SOURCE_HOST"
  fi
  # Expired backups go first: a full volume must not keep the next backup from being taken.
  prune
  log "backing up $APP_DB from $source:$PRIMARY_PORT to $target"
  # Written under a temporary name: a failed or unreadable dump never counts as a backup.
  if ! dump_to "$source" "$target.partial"; then
    rm -f "$target.partial"
    if [[ "$source" == "$PRIMARY_HOST" ]]; then log "backup FAILED"; exit 1; fi
    # A busy standby cancels a long dump when replay conflicts with it: the primary then.
    log "the dump from the replica $source failed; backing up from the primary $PRIMARY_HOST"
    if ! dump_to "$PRIMARY_HOST" "$target.partial"; then
      rm -f "$target.partial"
      log "backup FAILED"
      exit 1
    fi
  fi
  if ! "$(bin pg_restore)" --list "$target.partial" >/dev/null; then
    rm -f "$target.partial"
    log "backup FAILED: the dump cannot be read back"
    exit 1
  fi
  mv "$target.partial" "$target"
  local size; size="$(stat -c %s "$target")"
  log "backup complete and verified: $(basename "$target"), $size bytes"
  prune
  report "$(printf '{"name":"%s","sizeBytes":%s,"kept":%s}' "$(basename "$target")" "$size" "$(kept_backups)")"
}

# The backups on the volume, newest first, as JSON for status (at most 40: a
# termination message holds 4 KiB).
kept_backups() {
  local file out="" size
  while IFS= read -r file; do
    size="$(stat -c %s "$BACKUP_DIR/$file")" || continue
    out+="${out:+,}$(printf '{"name":"%s","sizeBytes":%s}' "$file" "$size")"
  done < <(find "$BACKUP_DIR" -maxdepth 1 -name "*.dump" -printf '%f\n' | sort -r | head -n 40)
  printf '[%s]' "$out"
}

restore() {
  local file="${1:-}"
  [[ -f "$file" ]] || { log "no backup file '$file'"; exit 2; }
  need PRIMARY_HOST; need APP_PASSWORD
  log "restoring $file into $APP_DB on $PRIMARY_HOST:$PRIMARY_PORT"
  PGPASSWORD="$APP_PASSWORD" "$(bin pg_restore)" -h "$PRIMARY_HOST" -p "$PRIMARY_PORT" -U "$APP_USER" \
    -d "$APP_DB" --clean --if-exists --no-owner --exit-on-error "$file"
  log "restore complete"
}

case "${1:-}" in
  start) start ;;
  init-primary) init_primary ;;
  init-replica) init_replica ;;
  ready) ready ;;
  live) live ;;
  apply-credentials) need CREDENTIALS_DIR; apply_credentials "$CREDENTIALS_DIR" ;;
  rejoin) rejoin ;;
  follow-orders) need ORDERS_DIR; follow_orders ;;
  backup) backup ;;
  prune) prune ;;
  restore) shift; restore "$@" ;;
  restore-new) restore_new ;;
  *) echo "usage: $0 start|init-primary|init-replica|rejoin|follow-orders|ready|live|apply-credentials|backup|prune|restore FILE|restore-new" >&2; exit 2 ;;
esac
