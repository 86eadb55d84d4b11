//! Names and labels of everything a MyDatabase owns.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::Result;
use crate::api::MyDatabase;
use crate::runtime::meta;

pub const CLUSTER_LABEL: &str = "keelson.dev/cluster";
pub const ROLE_LABEL: &str = "keelson.dev/role";
pub const PORT: i32 = 5432;
pub const APP_DB: &str = "app";
pub const APP_USER: &str = "app";
pub const SCRIPT: &str = "keelson-postgres.sh";

pub fn statefulset(db: &MyDatabase) -> String {
    db.name_any()
}
pub fn headless_service(db: &MyDatabase) -> String {
    format!("{}-headless", db.name_any())
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
pub fn scripts(db: &MyDatabase) -> String {
    format!("{}-scripts", db.name_any())
}
pub fn backups_pvc(db: &MyDatabase) -> String {
    format!("{}-backups", db.name_any())
}
pub fn backup_cronjob(db: &MyDatabase) -> String {
    format!("{}-backup", db.name_any())
}
pub fn final_backup_job(db: &MyDatabase) -> String {
    format!("{}-final-backup", db.name_any())
}
/// DNS name of pod 0, the primary, through the headless Service.
pub fn primary_host(db: &MyDatabase) -> String {
    format!("{}-0.{}", statefulset(db), headless_service(db))
}

/// Labels on every object of `db`, for `component` (database, backup, ...).
pub fn labels(db: &MyDatabase, component: &str) -> BTreeMap<String, String> {
    let mut labels = meta::recommended_labels("postgresql", component, &db.name_any());
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
