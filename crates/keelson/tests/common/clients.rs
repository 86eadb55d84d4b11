//! Clients inside the cluster that write to a MyDatabase and record every
//! commit they saw acknowledged, and by which server: one connection per
//! insert, one long-lived session (as a pool holds its connections), and a
//! sampler asking every instance whether it takes writes.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use serde_json::json;
use testkit::pods::shell_pod;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, kubectl};

/// The node the clients run on: node faults never hit it.
pub const CLIENT_NODE: &str = "keelson-node-1";

pub fn sql_in(ns: &TestNamespace, pod: &str, sql: &str) -> anyhow::Result<String> {
    Ok(kubectl(&["-n", &ns.name, "exec", pod, "-c", "postgres", "--", "psql", "-X", "-At", "-d", "app", "-c", sql])?
        .trim()
        .to_string())
}

/// A pod on `CLIENT_NODE` with database `db`'s connection URI in `$URI` running `script` until
/// `/tmp/stop` exists.
pub fn client(db: &str, name: &str, script: &str) -> serde_json::Value {
    let mut pod = shell_pod(name, "postgres:15.2", script);
    pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": CLIENT_NODE});
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "URI", "valueFrom": {"secretKeyRef": {"name": format!("{db}-credentials"), "key": "uri"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": format!("{db}-credentials"), "key": "password"}}},
        {"name": "PGCONNECT_TIMEOUT", "value": "2"},
        {"name": "PGOPTIONS", "value": "-c statement_timeout=3000"}]);
    trust_database_ca(&mut pod, db);
    await_network(&mut pod);
    pod
}

/// Makes the pod's script first wait (up to 10 s) until the host of `$URI` takes a TCP
/// connection from it: a NetworkPolicy engine admits a new pod's address a moment after the pod
/// starts (kube-router: about 0.1 s), and an application retries its first connection as well.
pub fn await_network(pod: &mut serde_json::Value) {
    const AWAIT: &str = r#"host="${URI#*@}"; host="${host%%[:/]*}"
for i in $(seq 100); do timeout 2 bash -c "echo > /dev/tcp/$host/5432" 2>/dev/null && break; sleep 0.1; done
"#;
    let command = &mut pod["spec"]["containers"][0]["command"][2];
    *command = json!(format!("{AWAIT}{}", command.as_str().unwrap_or_default()));
}

/// Mounts `ca.crt` of database `db`'s credentials Secret where libpq looks for it
/// (`PGSSLROOTCERT`), as an application does to use the Secret's `sslmode=verify-full` URI.
pub fn trust_database_ca(pod: &mut serde_json::Value, db: &str) {
    pod["spec"]["volumes"] = json!([{"name": "database-ca",
        "secret": {"secretName": format!("{db}-credentials"), "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]);
    let container = &mut pod["spec"]["containers"][0];
    container["volumeMounts"] = json!([{"name": "database-ca", "mountPath": "/etc/database-ca", "readOnly": true}]);
    let env = container["env"].as_array().cloned().unwrap_or_default();
    container["env"] = json!(
        env.into_iter()
            .chain([json!({"name": "PGSSLROOTCERT", "value": "/etc/database-ca/ca.crt"})])
            .collect::<Vec<_>>()
    );
}

/// One INSERT per connection through `-rw` (TLS, the certificate verified as the Secret's URI
/// asks), each acknowledged id logged with the time, each
/// refusal with psql's reason. The Service's name is looked up once: what is measured is Keelson
/// moving `-rw`, not the cluster's DNS (under the whole suite's load, one pause of two 5 s
/// resolver timeouts was seen).
pub const WRITER: &str = r#"host="${URI#*@}"; host="${host%%:*}"
until ip="$(getent hosts "$host" | awk '{print $1; exit}')" && [ -n "$ip" ]; do sleep 0.2; done
# The address to connect to; the name, for verify-full, stays in the URI.
URI="$URI&hostaddr=$ip"
i=0
until [ -f /tmp/stop ]; do
  i=$((i+1))
  # A connection to a server that was cut off hangs without an answer: give up on it.
  if timeout 10 psql "$URI" -X -q -v ON_ERROR_STOP=1 -c "INSERT INTO acked VALUES ($i)" 2>/tmp/error; then
    echo "ok $i $(date +%s%3N)"
  else
    echo "failed $i $(date +%s%3N) $(head -c 160 /tmp/error | tr '\n' ' ')"
    sleep 0.05
  fi
done
echo done"#;

/// One session held open through `-rw`, as a pool holds it: an INSERT every 20 ms, each
/// acknowledged id logged with the time and the address of the server that acknowledged it.
/// A broken session is opened again. No statement timeout: a cancelled wait for the synchronous
/// standby would come back as a commit the standbys may not have.
pub const SESSION_WRITER: &str = r#"host="${URI#*@}"; host="${host%%:*}"
until ip="$(getent hosts "$host" | awk '{print $1; exit}')" && [ -n "$ip" ]; do sleep 0.2; done
# The address to connect to; the name, for verify-full, stays in the URI.
URI="$URI&hostaddr=$ip"
export PGOPTIONS=""
# A session that has just ended leaves its pipe without a reader: writing to it must fail the
# write (and open a new session), not kill this shell with SIGPIPE.
trap '' PIPE
i=0
until [ -f /tmp/stop ]; do
  coproc SESSION { psql "$URI" -X -At -q -v ON_ERROR_STOP=1 2>/tmp/error; }
  while [ ! -f /tmp/stop ]; do
    i=$((i+1))
    echo "INSERT INTO acked_session VALUES ($i) RETURNING inet_server_addr();" >&"${SESSION[1]}" 2>/dev/null || break
    if read -t 5 -r server <&"${SESSION[0]}" && [ -n "$server" ]; then
      echo "ok $i $(date +%s%3N) $server"
    else
      echo "failed $i $(date +%s%3N) session ended: $(head -c 160 /tmp/error | tr '\n' ' ')"
      break
    fi
    sleep 0.02
  done
  kill "$SESSION_PID" 2>/dev/null; wait "$SESSION_PID" 2>/dev/null
  sleep 0.05
done
echo done"#;

/// Every instance, by its pod's address, in turn (a round takes well under a second while all
/// answer): does it take writes?
pub fn sampler(db: &str, instances: u32) -> String {
    format!(
        r#"until [ -f /tmp/stop ]; do
  line="$(date +%s%3N)"
  for n in {ordinals}; do
    # A server frozen after it accepted the connection never answers: give up on it.
    r="$(PGPASSWORD="$PASSWORD" timeout 5 psql -h {db}-$n.{db}-headless -U app -d app -X -At -c 'SELECT NOT pg_is_in_recovery()' 2>/dev/null || echo x)"
    line="$line $r"
  done
  echo "$line"
done
echo done"#,
        ordinals = (0..instances).map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
    )
}

/// The logs of a client pod once it has stopped (it must have succeeded).
pub async fn ended(ns: &TestNamespace, name: &str) -> anyhow::Result<String> {
    let pods = ns.api::<Pod>();
    let pod = testkit::wait_for(&pods, name, "the client to stop", DEFAULT_TIMEOUT, |p| {
        matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
    })
    .await?;
    let logs = pods.logs(name, &LogParams::default()).await?;
    anyhow::ensure!(pod.status.and_then(|s| s.phase).as_deref() == Some("Succeeded"), "{name} failed: {logs}");
    Ok(logs)
}

pub fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default()
}

pub fn acknowledged(logs: &str) -> Vec<(u64, u128)> {
    logs.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("ok ")?.split(' ');
            Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
        })
        .collect()
}

/// When each acknowledgement of the session writer came, and from which server.
pub fn acknowledging_servers(logs: &str) -> Vec<(u128, String)> {
    logs.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("ok ")?.split(' ').skip(1);
            Some((words.next()?.parse().ok()?, words.next()?.to_string()))
        })
        .collect()
}
