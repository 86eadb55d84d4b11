//! The instance's PostgreSQL metrics in Prometheus' text format, served by
//! the instance manager on `PORT` at `/metrics`: what a DBA graphs and
//! alerts on, read from the local server over its socket at each scrape (one
//! query, nothing kept between scrapes). Names follow postgres_exporter's
//! and CloudNativePG's where they have one, under `keelson_pg_`; labels are
//! bounded: the database's own standbys and slots, its databases, the
//! backend states.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;

use super::probe::Server;

/// Where the instance manager serves `/metrics` (postgres_exporter's port).
pub const PORT: u16 = 9187;
/// A scrape waits this long for the server.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything one scrape reports, as one JSON object.
pub const QUERY: &str = r#"SELECT json_build_object(
  'inRecovery', pg_is_in_recovery(),
  'timeline', (SELECT timeline_id FROM pg_control_checkpoint()),
  'walLsnBytes', pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery()
      THEN coalesce(pg_last_wal_replay_lsn(), '0/0') ELSE pg_current_wal_lsn() END, '0/0'),
  'walSizeBytes', (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir()),
  -- A replica: how old the last transaction it replayed is, 0 when it has replayed all it received.
  'replicationLagSeconds', CASE WHEN NOT pg_is_in_recovery() THEN NULL
      WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
      ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0) END,
  'standbys', (SELECT coalesce(json_agg(json_build_object(
      'name', application_name, 'streaming', state = 'streaming',
      'lagBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn),
      'lagSeconds', coalesce(extract(epoch FROM replay_lag), 0))), '[]') FROM pg_stat_replication),
  'slots', (SELECT coalesce(json_agg(json_build_object('name', slot_name, 'active', active,
      'retainedBytes', CASE WHEN pg_is_in_recovery() THEN NULL
        ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) END)), '[]') FROM pg_replication_slots),
  'backends', (SELECT coalesce(json_object_agg(state, n), '{}') FROM (SELECT coalesce(state, 'unknown') AS state,
      count(*) AS n FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1) s),
  'maxConnections', current_setting('max_connections')::int,
  'databases', (SELECT coalesce(json_agg(json_build_object('name', datname,
      'sizeBytes', pg_database_size(datname), 'xidAge', age(datfrozenxid))), '[]')
    FROM pg_database WHERE datallowconn AND NOT datistemplate)
)"#;

#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    pub in_recovery: bool,
    pub timeline: i64,
    pub wal_lsn_bytes: f64,
    pub wal_size_bytes: f64,
    pub replication_lag_seconds: Option<f64>,
    pub standbys: Vec<Standby>,
    pub slots: Vec<Slot>,
    pub backends: BTreeMap<String, i64>,
    pub max_connections: i64,
    pub databases: Vec<Database>,
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Standby {
    pub name: String,
    pub streaming: bool,
    pub lag_bytes: Option<f64>,
    pub lag_seconds: Option<f64>,
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    pub name: String,
    pub active: bool,
    pub retained_bytes: Option<f64>,
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Database {
    pub name: String,
    pub size_bytes: f64,
    pub xid_age: f64,
}

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Text(String);

impl Text {
    fn family(&mut self, name: &str, help: &str) {
        let _ = write!(self.0, "# HELP keelson_pg_{name} {help}\n# TYPE keelson_pg_{name} gauge\n");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        let _ = writeln!(self.0, "keelson_pg_{name}{labels} {value}");
    }

    fn one(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help);
        self.sample(name, &[], value);
    }
}

/// The text a scrape returns: `sample` is None when the server did not answer.
pub fn render(sample: Option<&Sample>) -> String {
    let mut text = Text(String::new());
    text.one("up", "1 when PostgreSQL answered this scrape", if sample.is_some() { 1.0 } else { 0.0 });
    let Some(s) = sample else { return text.0 };
    text.one("in_recovery", "1 on a replica, 0 on the primary", if s.in_recovery { 1.0 } else { 0.0 });
    text.one("timeline", "The WAL timeline (one more after each promotion)", s.timeline as f64);
    text.one(
        "wal_lsn_bytes",
        "The WAL position written (primary) or replayed (replica), in bytes: its rate is the WAL rate",
        s.wal_lsn_bytes,
    );
    text.one("wal_size_bytes", "Size of the WAL folder", s.wal_size_bytes);
    if let Some(lag) = s.replication_lag_seconds {
        text.one("replication_lag_seconds", "A replica: age of the last transaction replayed, 0 when caught up", lag);
    }
    if !s.standbys.is_empty() {
        text.family("standby_streaming", "The primary: 1 per standby that streams");
        for standby in &s.standbys {
            text.sample("standby_streaming", &[("standby", &standby.name)], if standby.streaming { 1.0 } else { 0.0 });
        }
        text.family("standby_lag_bytes", "The primary: WAL a standby has not replayed yet");
        for standby in &s.standbys {
            text.sample("standby_lag_bytes", &[("standby", &standby.name)], standby.lag_bytes.unwrap_or(0.0));
        }
        text.family("standby_lag_seconds", "The primary: a standby's replay lag (replay_lag)");
        for standby in &s.standbys {
            text.sample("standby_lag_seconds", &[("standby", &standby.name)], standby.lag_seconds.unwrap_or(0.0));
        }
    }
    if !s.slots.is_empty() {
        text.family("slot_active", "1 per replication slot in use");
        for slot in &s.slots {
            text.sample("slot_active", &[("slot", &slot.name)], if slot.active { 1.0 } else { 0.0 });
        }
        text.family("slot_retained_bytes", "WAL a replication slot keeps on the primary");
        for slot in s.slots.iter().filter(|slot| slot.retained_bytes.is_some()) {
            text.sample("slot_retained_bytes", &[("slot", &slot.name)], slot.retained_bytes.unwrap_or(0.0));
        }
    }
    text.family("backends", "Client connections by state");
    for (state, count) in &s.backends {
        text.sample("backends", &[("state", state)], *count as f64);
    }
    text.one("max_connections", "The max_connections setting", s.max_connections as f64);
    text.family("database_size_bytes", "Size of each database");
    for db in &s.databases {
        text.sample("database_size_bytes", &[("datname", &db.name)], db.size_bytes);
    }
    text.family("database_xid_age", "Transactions since a database's oldest unfrozen one (wraparound at 2^31)");
    for db in &s.databases {
        text.sample("database_xid_age", &[("datname", &db.name)], db.xid_age);
    }
    text.0
}

/// One scrape: the query, then its text.
pub async fn scrape(server: &Server) -> String {
    let answer = server.query(QUERY, QUERY_TIMEOUT).await;
    let sample = answer.ok().and_then(|json| serde_json::from_str::<Sample>(json.trim()).ok());
    render(sample.as_ref())
}

/// Serves `/metrics` on `PORT` until the manager ends. A port that cannot be bound is logged, not fatal:
/// the manager's first duty is the database.
pub async fn serve(server: Server) {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let server = server.clone();
            async move { ([("content-type", "text/plain; version=0.0.4")], scrape(&server).await) }
        }),
    );
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", PORT)).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, port = PORT, "cannot serve PostgreSQL metrics");
            return;
        }
    };
    if let Err(error) = axum::serve(listener, app).await {
        tracing::error!(%error, "the metrics server ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primary_reports_its_standbys_backends_and_databases() {
        let answer = r#"{"inRecovery": false, "timeline": 2, "walLsnBytes": 67108864, "walSizeBytes": 33554432,
            "replicationLagSeconds": null,
            "standbys": [{"name": "db-1", "streaming": true, "lagBytes": 8192, "lagSeconds": 0.25}],
            "slots": [], "backends": {"active": 1, "idle": 3}, "maxConnections": 100,
            "databases": [{"name": "app", "sizeBytes": 7500000, "xidAge": 1234}]}"#;
        let sample: Sample = serde_json::from_str(answer).expect("parses");
        let text = render(Some(&sample));
        for line in [
            "keelson_pg_up 1",
            "keelson_pg_in_recovery 0",
            "keelson_pg_timeline 2",
            "keelson_pg_standby_lag_bytes{standby=\"db-1\"} 8192",
            "keelson_pg_standby_lag_seconds{standby=\"db-1\"} 0.25",
            "keelson_pg_backends{state=\"idle\"} 3",
            "keelson_pg_max_connections 100",
            "keelson_pg_database_xid_age{datname=\"app\"} 1234",
            "# TYPE keelson_pg_wal_size_bytes gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("replication_lag_seconds"), "a primary has no replay lag of its own");
    }

    #[test]
    fn a_server_that_does_not_answer_is_down_and_nothing_else() {
        assert_eq!(
            render(None),
            "# HELP keelson_pg_up 1 when PostgreSQL answered this scrape\n# TYPE keelson_pg_up gauge\nkeelson_pg_up 0\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
