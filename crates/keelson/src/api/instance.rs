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
/// Set by the operator on every pod: PostgreSQL's `synchronous_standby_names`
/// for when that instance is the primary (empty: asynchronous).
pub const SYNCHRONOUS_STANDBYS: &str = "db.keelson.dev/synchronous-standbys";

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
}

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
            && self.answering == other.answering
            && self.unresponsive == other.unresponsive
            && replicas(self) == replicas(other)
    }
}
