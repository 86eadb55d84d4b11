//! The MyDatabase controller: PostgreSQL with streaming replicas, credentials,
//! scheduled backups with retention, and a deletion policy.

pub mod backup;
pub mod credentials;
pub mod deletion;
pub mod names;
pub mod pdb;
pub mod reconcile;
pub mod scripts;
pub mod services;
pub mod statefulset;
pub mod status;
pub mod validation;

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::MyDatabase;
use crate::manifests::rbac::Permission;
use crate::runtime::controller::drive;
use crate::runtime::{Context, MANAGED_BY_SELECTOR, scoped_api};

/// What the MyDatabase controller does with the API, and nothing more.
pub const RBAC: &[Permission] = &[
    Permission {
        group: "db.keelson.dev",
        resources: &["mydatabases"],
        verbs: &["get", "list", "watch", "patch", "update"],
    },
    Permission { group: "db.keelson.dev", resources: &["mydatabases/status"], verbs: &["get", "patch", "update"] },
    Permission { group: "db.keelson.dev", resources: &["mydatabases/finalizers"], verbs: &["update"] },
    Permission {
        group: "apps",
        resources: &["statefulsets"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Permission {
        group: "",
        resources: &["services", "secrets", "configmaps"],
        verbs: &["get", "list", "watch", "create", "patch"],
    },
    Permission {
        group: "",
        resources: &["persistentvolumeclaims"],
        verbs: &["get", "list", "create", "patch", "delete"],
    },
    Permission { group: "", resources: &["pods"], verbs: &["list", "patch"] },
    Permission {
        group: "batch",
        resources: &["cronjobs"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Permission { group: "batch", resources: &["jobs"], verbs: &["get", "list", "watch", "create"] },
    Permission {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
];

/// Runs the MyDatabase controller until `shutdown` resolves; calls `on_synced`
/// once the MyDatabase cache is filled.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    on_synced: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let owned = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let backup_jobs =
        watcher::Config::default().labels(&format!("{MANAGED_BY_SELECTOR},app.kubernetes.io/component=backup"));
    let controller = Controller::new(scoped_api::<MyDatabase>(&client, namespace), watcher::Config::default())
        .owns(scoped_api::<StatefulSet>(&client, namespace), owned.clone())
        .owns(scoped_api::<Service>(&client, namespace), owned.clone())
        .owns(scoped_api::<Secret>(&client, namespace), owned.clone())
        .owns(scoped_api::<ConfigMap>(&client, namespace), owned.clone())
        .owns(scoped_api::<CronJob>(&client, namespace), owned.clone())
        .owns(scoped_api::<PodDisruptionBudget>(&client, namespace), owned)
        // Backup Jobs belong to the CronJob, not to us: map them by label.
        .watches(scoped_api::<Job>(&client, namespace), backup_jobs, |job: Job| {
            let cluster = job.labels().get(names::CLUSTER_LABEL)?.clone();
            Some(ObjectRef::<MyDatabase>::new(&cluster).within(&job.namespace()?))
        })
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    drive(controller, reconcile::CONTROLLER, reconcile::reconcile, ctx, on_synced).await;
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::api::mydatabase::{BackupSpec, DeletionPolicy, MyDatabase, MyDatabaseSpec};
    use kube::api::ObjectMeta;

    /// The tutorial's MyDatabase, as the API server would hand it over.
    pub fn sample() -> MyDatabase {
        let mut db = MyDatabase::new(
            "production-db",
            MyDatabaseSpec {
                replicas: 3,
                version: "15.2".into(),
                storage: "100Gi".into(),
                image_repository: "postgres".into(),
                backup: Some(BackupSpec {
                    schedule: "0 2 * * *".into(),
                    retention: "7d".into(),
                    storage: "10Gi".into(),
                }),
                deletion_policy: DeletionPolicy::Retain,
            },
        );
        db.metadata = ObjectMeta {
            name: Some("production-db".into()),
            namespace: Some("default".into()),
            uid: Some("7c6d1a34-0000-4000-8000-000000000002".into()),
            generation: Some(1),
            ..Default::default()
        };
        db
    }
}
