//! `MyDatabase` (`db.keelson.dev/v1`): a PostgreSQL primary with streaming
//! replicas, credentials, scheduled backups and a deletion policy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{parameters, reference};

/// `kubectl annotate mydatabase <name> db.keelson.dev/switchover-to=<pod>`:
/// move the primary to that replica (removed once done or refused).
pub const SWITCHOVER_ANNOTATION: &str = "db.keelson.dev/switchover-to";
/// `kubectl annotate mydatabase <name> db.keelson.dev/backup-request=<token>`:
/// a backup now, as the schedule's would run (`kubectl keelson backup`). Each
/// new token is one backup; the token taken is `status.lastBackupRequest`.
pub const BACKUP_REQUEST_ANNOTATION: &str = "db.keelson.dev/backup-request";
/// Set by a person on a MyDatabase whose failover is blocked (replicas that
/// may hold the last acknowledged commits do not answer): promote the best of
/// those that did, accepting that those commits may be lost. Removed once used.
pub const FORCE_FAILOVER_ANNOTATION: &str = "db.keelson.dev/force-failover";
/// `kubectl annotate mydatabase <name> db.keelson.dev/fenced-instances=<pod>,<pod>`
/// (or `*`: every instance; `kubectl keelson fence`): those instances' PostgreSQL
/// is stopped, for maintenance, until they are taken off the list. Their pods
/// keep running, not ready. A fenced primary is not failed over: no writes until unfenced.
pub const FENCED_INSTANCES_ANNOTATION: &str = "db.keelson.dev/fenced-instances";

/// The instances `FENCED_INSTANCES_ANNOTATION` names, as written (`*` kept).
pub fn fenced_instances(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .get(FENCED_INSTANCES_ANNOTATION)
        .map(|list| list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect())
        .unwrap_or_default()
}

/// Whether `pod` is fenced by `FENCED_INSTANCES_ANNOTATION`.
pub fn is_fenced(annotations: &BTreeMap<String, String>, pod: &str) -> bool {
    fenced_instances(annotations).iter().any(|name| name == pod || name == "*")
}

/// PostgreSQL major versions Keelson knows how to run and replicate, and that
/// the PostgreSQL project still supports: 13 ended in November 2025, 14 in
/// November 2026. The CRD's rule on `spec.version` says the same.
pub const SUPPORTED_MAJORS: &[u32] = &[15, 16, 17, 18];

/// Desired state of a PostgreSQL database cluster.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "db.keelson.dev",
    version = "v1",
    kind = "MyDatabase",
    doc = "A PostgreSQL database: a primary with streaming replicas, credentials, scheduled backups and a deletion policy.",
    plural = "mydatabases",
    namespaced,
    status = "MyDatabaseStatus",
    shortname = "mydb",
    category = "keelson",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(name = "Replicas", type_ = "string", json_path = ".status.instances"),
    printcolumn(name = "Primary", type_ = "string", json_path = ".status.currentPrimary"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Last Backup", type_ = "date", json_path = ".status.lastBackupTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    // `kubectl scale mydb` (the schema's 1..16 still applies); no selector: not an HPA target.
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.readyReplicas")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.restoreFrom) == has(oldSelf.restoreFrom)").message("spec.restoreFrom can be set only when the MyDatabase is created"))]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName)").message("spec.storageClassName can be set only when the MyDatabase is created: data volumes keep their class"))]
pub struct MyDatabaseSpec {
    /// PostgreSQL instances: pod 0 is the primary, the others stream from it.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 16))]
    pub replicas: i32,

    /// PostgreSQL version as `major[.minor]`, e.g. `15` or `15.2`; majors 15 to 18 (13 and 14
    /// are past end of life). Within a major the version may move both ways; a major change
    /// needs a dump and restore.
    #[schemars(regex(pattern = r"^[0-9]{1,2}(\.[0-9]{1,3})?$"))]
    #[x_kube(validation = Rule::new("self.split('.')[0] in ['15', '16', '17', '18']").message("supported PostgreSQL majors are 15, 16, 17 and 18; 13 and 14 are past end of life"))]
    #[x_kube(validation = Rule::new("self.split('.')[0] == oldSelf.split('.')[0]").message("the major version cannot change in place; dump and restore into a new MyDatabase"))]
    pub version: String,

    /// Size of each instance's data volume, a Kubernetes quantity such as `100Gi`. May grow, never shrink.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(reference::POSITIVE_QUANTITY_RULE).message(reference::POSITIVE_QUANTITY_MESSAGE))]
    #[x_kube(validation = Rule::new("!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0").message("storage may grow but never shrink"))]
    pub storage: String,

    /// Image repository; the image is `<imageRepository>:<version>`. Override it for a private registry.
    #[serde(default = "default_image_repository")]
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new(reference::REPOSITORY_RULE).message(reference::REPOSITORY_MESSAGE))]
    pub image_repository: String,

    /// Scheduled logical backups (pg_dump) with retention. No backups when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// Start from a backup of another MyDatabase in this namespace instead of an empty
    /// database. The source may be deleted already if its backups volume was kept
    /// (deletionPolicy Retain or Snapshot). Set at creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.restoreFrom is immutable: it records where the database started from"))]
    pub restore_from: Option<RestoreFrom>,

    /// Other MyDatabases in this namespace that may restore from this one's
    /// backups (scheduled or the Snapshot policy's final one) with their
    /// `spec.restoreFrom`, by name, or `*` for any. None by default: a
    /// database's backups are its own (and a MyDatabase's re-created under its
    /// name). Recorded on the backups volume, so it still holds once this
    /// MyDatabase is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub restore_to: Vec<String>,

    /// What deleting the MyDatabase does to its data: Retain (the default) keeps the
    /// data volumes and backups, Snapshot takes a final backup and removes the data
    /// volumes, Delete removes data volumes and backups.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Synchronous (the default): a commit is acknowledged once at least one
    /// replica has it (`ANY 1` of the others, by name), so a failover loses
    /// nothing a client saw committed. With three or more instances one
    /// replica down does not stop writes; with two, writes wait while the
    /// replica is down (durability required). Preferred: synchronous while a
    /// standby streams; when none has for 5 s, Keelson records
    /// `status.asynchronous`, then the primary stops waiting, and a lost
    /// primary is not failed over automatically until a standby has caught up
    /// again. Asynchronous: writes never wait for a replica; a failover may
    /// lose the last commits. One instance has nothing to wait for.
    #[serde(default)]
    pub replication: ReplicationMode,

    /// Lets the `postgres` superuser log in over the network (TLS and a
    /// password), with the password in the Secret `<name>-superuser`, which
    /// Keelson creates. Off by default: applications use the app role, and a
    /// DBA reaches the superuser with `kubectl exec` (peer authentication on
    /// the local socket). Turning it off again removes the Secret, and the
    /// password from the role.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superuser_access: bool,

    /// Who may connect to the instances. Keelson keeps a NetworkPolicy named
    /// like the database that admits PostgreSQL (5432) from `clients` and from
    /// the database's own pods (replication, backups), the metrics port (9187)
    /// from `metricsClients`, and nothing else. Absent: on, with every pod of
    /// the namespace as a client. Enforced only where the cluster runs a
    /// NetworkPolicy engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,

    /// TLS is always on. Keelson issues the server certificate from a CA of
    /// the database's own unless `tls.serverSecret` names one to present instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Compute resources of PostgreSQL's container. Default: a request of
    /// `memory: 256Mi`, no limits (Burstable; set a CPU request for
    /// production). Limits for
    /// cpu and memory equal to the requests (or limits alone) make the pods
    /// Guaranteed: Keelson then gives its instance manager equal requests and
    /// limits too. Changing them rolls the instances (replicas first, then a
    /// switchover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// StorageClass of the data volumes; the cluster's default when absent.
    /// Set at creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.storageClassName is immutable: data volumes keep their class"))]
    pub storage_class_name: Option<String>,

    /// PostgreSQL's own settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgresql: Option<PostgresqlSpec>,

    /// Nodes the instances may run on, by label (as in a pod's spec).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the instances (and backup Jobs) tolerate (as in a pod's spec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,

    /// Node and pod affinity of the instances (as in a pod's spec). Without
    /// a `podAntiAffinity` of yours, Keelson prefers one instance per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Secrets for pulling the PostgreSQL image from a private registry
    /// (instances, backups and restores).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// PriorityClass of the instances' pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
}

/// PostgreSQL's own settings.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    /// Settings for `postgresql.conf`, e.g. `work_mem: 16MB`, from an
    /// allowlist (docs/production.md); those Keelson manages (replication,
    /// TLS, durability) are refused by name. A change rolls the instances,
    /// replicas first, so a value PostgreSQL refuses stops at the first
    /// replica. `max_connections` may grow but not shrink in place (replicas
    /// need at least the primary's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "parameters::schema")]
    pub parameters: BTreeMap<String, String>,
}

/// The label a Secret must carry, naming the MyDatabase, for `spec.tls.serverSecret` to use it.
pub const SERVER_CERTIFICATE_FOR_LABEL: &str = "db.keelson.dev/server-certificate-for";

/// Certificates from elsewhere (cert-manager, a company CA).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A Secret in this namespace with `tls.crt`, `tls.key` and `ca.crt` (as
    /// cert-manager writes them) for the instances to present. Its certificate
    /// must name `<name>-rw` and `<name>-ro` (as clients write them) and
    /// `*.<name>-headless`; its `ca.crt` is handed to clients in
    /// `<name>-credentials`, and replicas check their primary against it. The
    /// Secret must carry the label `db.keelson.dev/server-certificate-for:
    /// <name>` (cert-manager: `secretTemplate.labels`): otherwise naming another
    /// database's Secret would hand its key to this one's pods. The instances
    /// reload it when it is renewed.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"), length(min = 1, max = 253))]
    pub server_secret: String,
}

/// How commits wait for replicas.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum ReplicationMode {
    #[default]
    Synchronous,
    Preferred,
    Asynchronous,
}

/// Which backup a new MyDatabase starts from.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreFrom {
    /// The MyDatabase (in this namespace) whose backups volume, `<database>-backups`, holds the backup.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(min = 1, max = 63))]
    pub database: String,

    /// A backup's file name, as the source's `status.lastBackupName` shows it, e.g.
    /// `app-20261203T020000Z.dump`. The newest backup when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*\.dump$"), length(max = 128))]
    pub backup: Option<String>,
}

/// When backups run and how long they are kept.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName)").message("spec.backup.storageClassName can be set only with the first backup settings: the backups volume keeps its class"))]
pub struct BackupSpec {
    /// Cron schedule with 5 fields (minute hour day-of-month month day-of-week), e.g. `0 2 * * *`,
    /// or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, as CronJobs take it.
    #[schemars(
        regex(pattern = r"^\s*(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)\s*$"),
        length(max = 128)
    )]
    pub schedule: String,

    /// How long a backup is kept: a number and a unit, h (hours), d (days) or w (weeks), e.g. `7d`.
    /// The newest backup is never pruned.
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,4}[hdw]$"))]
    pub retention: String,

    /// Size of the volume that holds the backups.
    #[serde(default = "default_backup_storage")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(reference::POSITIVE_QUANTITY_RULE).message(reference::POSITIVE_QUANTITY_MESSAGE))]
    pub storage: String,

    /// StorageClass of the backups volume; the cluster's default when absent.
    /// Set with the first backup only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.backup.storageClassName is immutable: the backups volume keeps its class"))]
    pub storage_class_name: Option<String>,
}

/// `spec.networkPolicy`: the database's NetworkPolicy.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// false: Keelson keeps no NetworkPolicy for this database (and deletes its
    /// own); the instances then accept connections from wherever the cluster routes.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Who may connect on 5432, as NetworkPolicy peers (`podSelector`,
    /// `namespaceSelector`, `ipBlock`). Absent: every pod in the database's
    /// namespace. `[]`: only the database's own pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub clients: Option<Vec<NetworkPolicyPeer>>,
    /// Who may read the instances' metrics on 9187 (they hold no secrets).
    /// Absent: anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub metrics_clients: Option<Vec<NetworkPolicyPeer>>,
}

fn default_true() -> bool {
    true
}

/// Annotation on a backups volume: who may restore from it (`spec.backup.restoreTo`).
pub const RESTORE_TO_ANNOTATION: &str = "db.keelson.dev/restore-to";

/// What happens to data when a MyDatabase is deleted.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Snapshot,
    Delete,
}

fn default_replicas() -> i32 {
    1
}

fn default_image_repository() -> String {
    "postgres".to_string()
}

fn default_backup_storage() -> String {
    "10Gi".to_string()
}

/// Observed state of a MyDatabase, written by Keelson only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyDatabaseStatus {
    /// Pending, Creating, Running, Degraded, Failed or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatabasePhase>,
    /// True when the primary accepts connections and every replica is ready.
    #[serde(default)]
    pub ready: bool,
    /// Instances whose readiness probe (pg_isready) passes.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Ready over desired instances, e.g. `3/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<String>,
    /// Completion time of the newest successful backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_time: Option<Time>,
    /// File name of the newest successful backup in the backups volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_name: Option<String>,
    /// Size in bytes of the newest successful backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_size_bytes: Option<i64>,
    /// The backups kept on the backups volume, newest first, as the newest
    /// backup left them (after pruning by retention). Each was read back
    /// (`pg_restore --list`) before it counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<BackupRecord>,
    /// The last `db.keelson.dev/backup-request` token taken (its Job started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_request: Option<String>,
    /// The pod Keelson chose as primary. A change of primary is recorded here
    /// before any instance is told (the pods' role labels follow it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// The uid of that pod when it was chosen: a restarted operator tells it
    /// from a replacement of the same name (which serves nothing yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary_uid: Option<String>,
    /// The PostgreSQL version the primary runs (`SHOW server_version`), next to `spec.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// The newest failover: which primary was lost and why, which replica was
    /// promoted, and the positions compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<FailoverRecord>,
    /// The newest fresh clone of a replica over its older data (it could not
    /// follow the primary any other way), with an Event `ReplicaRebuilt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replica_rebuild: Option<ReplicaRebuild>,
    /// Set while the primary acknowledges commits no standby has confirmed
    /// (`replication: Preferred`, no standby streaming). Written before the
    /// primary stops waiting; removed once a standby has every commit again.
    /// While set, a lost primary is not failed over automatically: it alone
    /// holds the newest commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asynchronous: Option<AsynchronousPeriod>,
    /// Each instance: its role, readiness and replication lag, from its pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_statuses: Vec<InstanceStatus>,
    /// The Secret holding the connection details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, BackupScheduled, LastBackupSucceeded and SpecValid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A failover or switchover, as Keelson decided it.
/// One backup kept on the backups volume.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The dump's file name, e.g. `app-20261206T144737Z.dump`.
    pub name: String,
    /// When it was taken (from its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    pub size_bytes: i64,
    /// Read back completely when it was taken.
    pub verified: bool,
}

/// A time in which a primary acknowledged commits without a standby's confirmation.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsynchronousPeriod {
    /// The primary that stopped waiting for standbys.
    pub primary: String,
    /// When Keelson let it stop waiting.
    pub since: Time,
}

/// A replica cloned afresh over its older data.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRebuild {
    pub instance: String,
    pub at: Time,
    /// Why its data could not follow the primary.
    pub reason: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// `Failover` (the primary was lost) or `Switchover` (Keelson moved it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The primary that was lost.
    pub from: String,
    /// The replica promoted.
    pub to: String,
    /// Why the primary counted as lost.
    pub reason: String,
    /// When the loss was seen (a switchover: when the primary was stepped down).
    pub lost_at: Option<Time>,
    /// When the promotion was decided (all live replicas had answered).
    pub promoted_at: Option<Time>,
    /// When the promoted instance first reported taking writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_at: Option<Time>,
    /// Writes down as Keelson saw it: from `lostAt` to `servingAt`, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_down_ms: Option<i64>,
    /// Each candidate's received WAL position, `<pod> at <lsn>`.
    #[serde(default)]
    pub positions: Vec<String>,
}

/// One PostgreSQL instance, as the operator last heard from it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// The pod.
    pub name: String,
    /// primary or replica; absent until its instance manager reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<super::instance::Role>,
    /// Its readiness probe passes (a replica: it streams).
    #[serde(default)]
    pub ready: bool,
    /// A replica: WAL its primary wrote that it has not replayed, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// A replica: how far behind it replays, in seconds (`replay_lag`; 0 when caught up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<String>,
    /// The WAL timeline it is on (one more after each promotion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
}

/// Lifecycle phase of a MyDatabase.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum DatabasePhase {
    Pending,
    Creating,
    Running,
    Degraded,
    Failed,
    Deleting,
}
