//! Names and labels of everything a MyDatabase owns.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::Result;
use crate::api::MyDatabase;
use crate::runtime::meta::{self, DerivedName};

pub const CLUSTER_LABEL: &str = "keelson.dev/cluster";
pub use crate::api::instance::ROLE_LABEL;
pub const PORT: i32 = 5432;
pub const APP_DB: &str = "app";
pub const APP_USER: &str = "app";
pub const SCRIPT: &str = "keelson-postgres.sh";

const HEADLESS: &str = "-headless";
const BACKUP: &str = "-backup";
const FINAL_BACKUP: &str = "-final-backup";
/// A requested backup's Job: `<name>-backup-<10 hex digits>` (the CronJob's have 8 decimal digits).
const REQUESTED_BACKUP: &str = "-backup-0123456789";

/// Names that grow with the MyDatabase's: the admission limit on its name comes from these.
pub const DERIVED_NAMES: &[DerivedName] = &[
    // `controller-revision-hash` = `<statefulset>-<up to 10 digits>`.
    DerivedName { suffix: "", added_by_kubernetes: 11, limit: 63, what: "the pods' controller-revision-hash label" },
    DerivedName { suffix: HEADLESS, added_by_kubernetes: 0, limit: 63, what: "a Service name (DNS label)" },
    // The CronJob controller appends an 11-character time to name its Jobs.
    DerivedName { suffix: BACKUP, added_by_kubernetes: 0, limit: 52, what: "a CronJob name" },
    DerivedName {
        suffix: REQUESTED_BACKUP,
        added_by_kubernetes: 0,
        limit: 63,
        what: "a requested backup's job-name label",
    },
    DerivedName {
        suffix: FINAL_BACKUP,
        added_by_kubernetes: 0,
        limit: 63,
        what: "the final backup Job's job-name label",
    },
];

/// The Job of the backup requested with `token` (`db.keelson.dev/backup-request`) of database `db`.
pub fn requested_backup_job(db: &str, token: &str) -> String {
    let hash = crate::runtime::drift::content_hash(&token, "backup request").unwrap_or_default();
    format!("{db}-backup-{}", &hash[..10.min(hash.len())])
}

pub fn statefulset(db: &MyDatabase) -> String {
    db.name_any()
}
pub fn headless_service(db: &MyDatabase) -> String {
    format!("{}{HEADLESS}", db.name_any())
}
pub fn rw_service(db: &MyDatabase) -> String {
    format!("{}-rw", db.name_any())
}
pub fn ro_service(db: &MyDatabase) -> String {
    format!("{}-ro", db.name_any())
}
pub fn credentials(db: &MyDatabase) -> String {
    format!("{}-credentials", db.name_any())
}
/// The replication role's password: only the instances mount it.
pub fn replication_secret(db: &MyDatabase) -> String {
    format!("{}-replication", db.name_any())
}
/// The superuser's password, with `spec.superuserAccess` only.
pub fn superuser_secret(db: &MyDatabase) -> String {
    format!("{}-superuser", db.name_any())
}
/// The database's own CA (certificate and key): only the operator reads it.
pub fn ca_secret(db: &MyDatabase) -> String {
    format!("{}-ca", db.name_any())
}
/// The certificate and key the instances present to clients and to each other.
pub fn server_secret(db: &MyDatabase) -> String {
    format!("{}-server", db.name_any())
}
pub fn scripts(db: &MyDatabase) -> String {
    format!("{}-scripts", db.name_any())
}
pub fn backups_pvc(db: &MyDatabase) -> String {
    backups_pvc_of(&db.name_any())
}
pub fn backup_cronjob(db: &MyDatabase) -> String {
    format!("{}{BACKUP}", db.name_any())
}
pub fn final_backup_job(db: &MyDatabase) -> String {
    format!("{}{FINAL_BACKUP}", db.name_any())
}
/// The instance managers' ServiceAccount, Role and RoleBinding.
pub fn instance_access(db: &MyDatabase) -> String {
    format!("{}-instance", db.name_any())
}
/// The pods of `db`'s instances, by ordinal.
pub fn instance_pods(db: &MyDatabase) -> Vec<String> {
    (0..db.spec.replicas.max(0)).map(|ordinal| format!("{}-{ordinal}", statefulset(db))).collect()
}
/// The ordinal of an instance's pod, from its name (`<statefulset>-<ordinal>`).
pub fn ordinal(pod: &str) -> Option<u32> {
    pod.rsplit('-').next()?.parse().ok()
}
/// The PodDisruptionBudget that holds the primary back (the replicas' is named like the StatefulSet).
pub fn primary_budget(db: &MyDatabase) -> String {
    format!("{}-primary", db.name_any())
}
/// The NetworkPolicy in front of the instances (`spec.networkPolicy`).
pub fn network_policy(db: &MyDatabase) -> String {
    db.name_any()
}
pub fn restore_job(db: &MyDatabase) -> String {
    format!("{}-restore", db.name_any())
}
/// The data volume of pod 0, as the StatefulSet's claim template names it.
pub fn first_data_claim(db: &MyDatabase) -> String {
    format!("data-{}-0", statefulset(db))
}
/// The backups volume of another MyDatabase, `database`, in the same namespace.
pub fn backups_pvc_of(database: &str) -> String {
    format!("{database}-backups")
}
/// `app.kubernetes.io/name` of everything a MyDatabase owns.
pub const APP_NAME: &str = "postgresql";

/// Labels on every object of `db`, for `component` (database, backup, ...).
pub fn labels(db: &MyDatabase, component: &str) -> BTreeMap<String, String> {
    let mut labels = meta::recommended_labels(APP_NAME, component, &db.name_any());
    labels.insert(CLUSTER_LABEL.into(), db.name_any());
    labels
}

/// Selects the database pods of `db`.
pub fn pod_selector(db: &MyDatabase) -> BTreeMap<String, String> {
    [(CLUSTER_LABEL.to_string(), db.name_any()), ("app.kubernetes.io/component".to_string(), "database".to_string())]
        .into()
}

/// Metadata owned by `db` (garbage-collected with it).
pub fn owned_meta(db: &MyDatabase, name: String, component: &str) -> Result<ObjectMeta> {
    meta::owned(db, name, labels(db, component))
}

/// Metadata of objects that must outlive `db` under some deletion policies.
pub fn unowned_meta(db: &MyDatabase, name: String, component: &str) -> ObjectMeta {
    meta::unowned(db, name, labels(db, component))
}
