//! One look at the local PostgreSQL: a single query over the pod's socket
//! (`psql`, from the PostgreSQL image the manager runs in), answering with
//! the JSON of an `InstanceReport`.

use std::time::Duration;

use tokio::process::Command;

use crate::api::instance::InstanceReport;

/// Role, version, timeline (a replica: the one it receives) and positions in one snapshot. On a primary,
/// `pg_stat_replication` names each replica by its `application_name` (its
/// pod, see `keelson-postgres.sh`) with the WAL it has not replayed yet.
pub const QUERY: &str = r#"
SELECT json_build_object(
  'role', CASE WHEN pg_is_in_recovery() THEN 'replica' ELSE 'primary' END,
  'serverVersion', split_part(current_setting('server_version'), ' ', 1),
  -- A replica's: the newest it knows of. Its last checkpoint's lags behind, and a held
  -- replica has no WAL receiver; a timeline's history file arrives as it is followed.
  'timeline', CASE WHEN pg_is_in_recovery()
      THEN greatest((SELECT received_tli FROM pg_stat_wal_receiver), (SELECT timeline_id FROM pg_control_checkpoint()),
        (SELECT max(('x' || substr(name, 1, 8))::bit(32)::int) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{8}\.history$'))
      ELSE (SELECT timeline_id FROM pg_control_checkpoint()) END,
  'lsn', CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
  -- After its WAL receiver restarts, the received position starts again at a segment's
  -- beginning: what was replayed counts as well.
  'receivedLsn', CASE WHEN pg_is_in_recovery()
      THEN greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) END,
  'streaming', EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'),
  -- Its data's last fresh clone over older data, '<epoch> <why>' (keelson-postgres.sh reclone).
  -- Read as bytes, kept only when well formed: no content of that file can fail this look.
  'rebuilt', (SELECT CASE WHEN said ~ '^[0-9]{1,12} [ -~]+$' THEN said END FROM (SELECT trim(E'\n ' FROM
      encode(pg_read_binary_file(current_setting('data_directory') || '/../.keelson-rebuilt', 0, 512, true), 'escape'))
      AS said) AS file),
  -- A primary: the standbys it waits for now (a scale-down removes one only once it is not named).
  'synchronousStandbyNames', CASE WHEN pg_is_in_recovery() THEN NULL
      ELSE current_setting('synchronous_standby_names') END,
  -- Holding for a failover: a replica with no upstream to stream from.
  'held', pg_is_in_recovery() AND current_setting('primary_conninfo') = '',
  'replicas', (SELECT coalesce(json_agg(json_build_object(
       'name', application_name,
       'state', state,
       'lagBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint,
       -- NULL once a replica has replayed everything and no new WAL came.
       'lagMs', (extract(epoch FROM replay_lag) * 1000)::bigint) ORDER BY application_name), '[]')
     FROM pg_stat_replication)
)"#;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot run psql: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("psql timed out after {0:?}")]
    Timeout(Duration),
    #[error("psql failed: {0}")]
    Failed(String),
    #[error("unexpected answer {answer:?}: {source}")]
    Parse {
        answer: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Where the local server listens: its socket folder and port.
#[derive(Clone, Debug)]
pub struct Server {
    pub socket_dir: String,
    pub port: u16,
    /// The folder of `psql`; empty: from PATH.
    pub bin_dir: String,
}

/// Why a look got no report, and whether the server still responds to a
/// connection attempt (`pg_isready`): one that does is busy (a checkpoint's
/// I/O on a loaded node), starting or stopping, not hung.
#[derive(Debug)]
pub struct Unanswered {
    pub error: ProbeError,
    pub responds: bool,
}

impl Server {
    fn tool(&self, name: &str) -> String {
        if self.bin_dir.is_empty() { name.into() } else { format!("{}/{name}", self.bin_dir) }
    }

    fn psql(&self) -> String {
        self.tool("psql")
    }

    /// A look (see [`Server::probe`]) within `timeout`. An answer that fails,
    /// or has not come by half of it, is followed by the question whether the
    /// server responds at all, in the time left.
    pub async fn look(&self, timeout: Duration) -> Result<InstanceReport, Unanswered> {
        let half = timeout / 2;
        let probe = self.probe(timeout);
        tokio::pin!(probe);
        let early = tokio::select! {
            result = &mut probe => Some(result),
            _ = tokio::time::sleep(half) => None,
        };
        let (result, responds) = match early {
            Some(Ok(report)) => return Ok(report),
            Some(Err(error)) => (Err(error), self.responds(half).await),
            None => tokio::join!(probe, self.responds(timeout.saturating_sub(half))),
        };
        result.map_err(|error| Unanswered { error, responds })
    }

    /// The server answers a connection attempt (accepting, or starting or
    /// stopping), within `timeout`; a hung postmaster never does.
    async fn responds(&self, timeout: Duration) -> bool {
        // Whole seconds, rounded up: 1.5 s must not become a 1 s chance to answer.
        let seconds = timeout.as_millis().div_ceil(1000).max(1).to_string();
        let mut command = Command::new(self.tool("pg_isready"));
        command.args(["-q", "-h", &self.socket_dir, "-p", &self.port.to_string(), "-t", &seconds]).kill_on_drop(true);
        let status = tokio::time::timeout(timeout, command.status()).await;
        // 0: accepting; 1: rejecting (starting up, shutting down); 2: no response.
        matches!(status, Ok(Ok(status)) if matches!(status.code(), Some(0 | 1)))
    }

    pub async fn probe(&self, timeout: Duration) -> Result<InstanceReport, ProbeError> {
        parse(&self.query(QUERY, timeout).await?)
    }

    /// The answer to `sql` (one value, unaligned), as the superuser over the socket, within `timeout`.
    pub async fn query(&self, sql: &str, timeout: Duration) -> Result<String, ProbeError> {
        let mut command = Command::new(self.psql());
        command
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres"])
            .args(["-h", &self.socket_dir, "-p", &self.port.to_string(), "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .kill_on_drop(true);
        let output = tokio::time::timeout(timeout, command.output())
            .await
            .map_err(|_| ProbeError::Timeout(timeout))?
            .map_err(ProbeError::Spawn)?;
        if !output.status.success() {
            return Err(ProbeError::Failed(String::from_utf8_lossy(&output.stderr).trim().to_string()));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

pub fn parse(answer: &str) -> Result<InstanceReport, ProbeError> {
    serde_json::from_str(answer.trim()).map_err(|source| ProbeError::Parse { answer: answer.trim().into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::instance::Role;

    #[test]
    fn a_primary_answer_names_its_replicas_and_their_lag() {
        let report = parse(
            r#"{"role" : "primary", "serverVersion" : "15.18", "timeline" : 1, "lsn" : "0/3000148", "streaming" : false,
                "replicas" : [{"name" : "db-1", "state" : "streaming", "lagBytes" : 0},
                              {"name" : "db-2", "state" : "catchup", "lagBytes" : 8192}]}"#,
        )
        .expect("parses");
        assert_eq!(report.role, Role::Primary);
        assert_eq!(report.server_version, "15.18");
        assert_eq!(report.replicas[1].lag_bytes, Some(8192));
    }

    #[test]
    fn a_replica_that_never_replayed_has_no_position_and_is_refused() {
        let error = parse(
            r#"{"role":"replica","serverVersion":"15.18","timeline":1,"lsn":null,"streaming":false,"replicas":[]}"#,
        )
        .expect_err("no lsn");
        assert!(error.to_string().contains("unexpected answer"), "{error}");
    }
}
