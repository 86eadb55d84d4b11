//! What each MyDatabase pod's instance manager (`keelson instance run`)
//! reports about its PostgreSQL, as JSON in the pod's
//! `db.keelson.dev/instance` annotation. The operator reads it from its pod
//! cache for status (and failover), never by connecting to the pod.

use serde::{Deserialize, Serialize};

pub const ANNOTATION: &str = "db.keelson.dev/instance";
/// The role the operator chose for a pod: `primary` or `replica`. The
/// Services select on it; the instance manager hands it to PostgreSQL.
pub const ROLE_LABEL: &str = "keelson.dev/role";
/// Set by the operator on a replica's pod when it needs that replica's
/// position now (a failover); the manager answers with `answering` = its value.
pub const POSITION_REQUEST: &str = "db.keelson.dev/position-request";
/// Set by the operator on a replica's pod, with a position request's token,
/// when the replica must let go of the primary: it stops streaming (its
/// position is then final), so a primary that is still running can no longer
/// have commits confirmed by it. Removed once a primary is chosen.
pub const HOLD_STREAMING: &str = "db.keelson.dev/hold-streaming";
/// Written by the instance manager with each report: the image it was
/// installed from (`keelson instance install --image`). The operator upgrades a
/// manager that runs another image than its own in place (`mydatabase::upgrade`).
pub const MANAGER_IMAGE: &str = "db.keelson.dev/manager-image";
/// Set by the operator on every pod: PostgreSQL's `synchronous_standby_names`
/// for when that instance is the primary (empty: asynchronous).
pub const SYNCHRONOUS_STANDBYS: &str = "db.keelson.dev/synchronous-standbys";
/// Set by the operator on every pod: how many instances the database has. A
/// primary with others fences itself when cut off (`instance::lease`), also in
/// a term in which no standby was named or streamed yet (asynchronous
/// replication, or a Preferred primary that went on alone): another may be
/// promoted meanwhile (forced, or asynchronous).
pub const INSTANCES: &str = "db.keelson.dev/instances";
/// Set by the operator on a replica's pod: the primary's pod address, which
/// it streams from (not the `-rw` Service: kube-proxy moves that on each node
/// in its own time, and a cut-off former primary must never be streamed from
/// again). Changed in the same write that lifts a failover's hold.
pub const UPSTREAM: &str = "db.keelson.dev/upstream";
/// Set with the upstream: how the replica checks its primary's certificate.
/// `verify-ca` when the primary's pod presents the database's certificate;
/// `prefer` only for a primary from before TLS (a database being rolled onto it).
pub const UPSTREAM_SSLMODE: &str = "db.keelson.dev/upstream-sslmode";
/// Set by the operator on the pod of an instance fenced for maintenance
/// (`mydatabase::FENCED_INSTANCES_ANNOTATION`), with why: its PostgreSQL stops
/// and stays stopped until the order goes.
pub const FENCE: &str = "db.keelson.dev/fence";
/// The order's value: what the manager hands PostgreSQL's container, and says.
pub const FENCE_REASON: &str = "fenced for maintenance (db.keelson.dev/fenced-instances)";

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Replica,
}

/// One instance's PostgreSQL as its manager last saw it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    pub role: Role,
    /// `SHOW server_version`, without the packager's suffix: e.g. `15.18`.
    pub server_version: String,
    pub timeline: i64,
    /// The primary's write position, or how far a replica has replayed.
    pub lsn: String,
    /// A replica: how far it has received (and flushed) WAL from the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<String>,
    /// A replica: the WAL receiver is streaming from the primary.
    #[serde(default)]
    pub streaming: bool,
    /// When its data was last cloned afresh over older data, and why: `<epoch seconds> <why>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt: Option<String>,
    /// A primary: its `synchronous_standby_names` as it applies them now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous_standby_names: Option<String>,
    /// A replica holding for a failover (no upstream): its position is final.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// The position request this report answers, if it answers one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answering: Option<String>,
    /// A primary: its replicas, from `pg_stat_replication`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaReport>,
    /// The server answered before and has not for a while (hung, crashed or
    /// restarting): the rest of the report is the last thing it said.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unresponsive: bool,
    /// Fenced for maintenance: stopped on purpose (never reported unresponsive).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
}

/// A primary's lease: its manager counts it up on its pod every
/// `LEASE_RENEW_EVERY` while it reaches the API server. The operator takes a
/// primary whose count it has not seen move for `LEASE_EXPIRES_AFTER` for
/// lost; the manager fences its server before that (see `instance::lease`).
pub const LEASE: &str = "db.keelson.dev/primary-lease";
/// How often a primary's manager renews its lease.
pub const LEASE_RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// A primary that could not renew for this long (counted from sending the
/// last renewal that succeeded), and has no replica streaming from it, stops
/// its server: it may be cut off, and another may be promoted soon.
pub const FENCE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// The operator takes a primary whose lease it has not seen renewed for this
/// long for lost. Longer than `FENCE_AFTER` by the time a fast shutdown takes
/// to end every session.
pub const LEASE_EXPIRES_AFTER: std::time::Duration = std::time::Duration::from_secs(8);

/// One replica as its primary sees it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaReport {
    /// The replica's pod (its `application_name`).
    pub name: String,
    /// `streaming`, `catchup`, ...
    pub state: String,
    /// WAL the primary wrote that the replica has not replayed yet.
    pub lag_bytes: Option<i64>,
    /// How long ago the newest WAL it replayed was written on the primary
    /// (`replay_lag`), in milliseconds; none when it has replayed everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<i64>,
}

#[cfg(test)]
impl InstanceReport {
    /// A primary's report at `lsn` with these replicas `(name, state, lag bytes)`, for tests.
    pub fn primary_for_tests(lsn: &str, replicas: &[(&str, &str, i64)]) -> Self {
        InstanceReport {
            role: Role::Primary,
            server_version: "15.18".into(),
            timeline: 1,
            lsn: lsn.into(),
            received_lsn: None,
            streaming: false,
            rebuilt: None,
            synchronous_standby_names: None,
            held: false,
            answering: None,
            replicas: replicas
                .iter()
                .map(|(name, state, lag)| ReplicaReport {
                    name: (*name).into(),
                    state: (*state).into(),
                    lag_bytes: Some(*lag),
                    lag_ms: None,
                })
                .collect(),
            unresponsive: false,
            fenced: false,
        }
    }
}

impl InstanceReport {
    /// Changes worth reporting at once; positions alone are reported at most
    /// every few seconds (see `instance::Reporter`).
    pub fn same_shape(&self, other: &InstanceReport) -> bool {
        let replicas =
            |r: &InstanceReport| r.replicas.iter().map(|x| (x.name.clone(), x.state.clone())).collect::<Vec<_>>();
        self.role == other.role
            && self.server_version == other.server_version
            && self.timeline == other.timeline
            && self.streaming == other.streaming
            && self.held == other.held
            && self.answering == other.answering
            && self.unresponsive == other.unresponsive
            && self.fenced == other.fenced
            && self.synchronous_standby_names == other.synchronous_standby_names
            && self.rebuilt == other.rebuilt
            && replicas(self) == replicas(other)
    }
}
