//! The MyDatabase controller: PostgreSQL with streaming replicas, credentials,
//! scheduled backups with retention, and a deletion policy.
//!
//! `observed` reads, `validation` validates, one file per child builds
//! (`credentials`, `scripts`, `services`, `statefulset`, `pdb`, `backup`),
//! `reconcile` runs the pipeline, `status` derives the status, `deletion`
//! is the finalizer's stage; `ha` keeps the primary (failover, switchover,
//! synchronous standbys).

pub mod backup;
pub mod credentials;
pub mod deletion;
pub mod ha;
pub mod instance_access;
pub mod instances;
pub mod names;
pub mod network_policy;
pub mod observed;
pub mod parameters;
pub mod pdb;
pub mod placement;
pub mod reconcile;
pub mod resources;
pub mod restore;
pub mod rollout;
pub mod scripts;
pub mod secret_data;
pub mod services;
pub mod statefulset;
pub mod status;
pub mod tls;
pub mod upgrade;
pub mod validation;
pub mod watches;

use std::sync::Arc;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::api::MyDatabase;
use crate::runtime::cache;
use crate::runtime::controller::{ControllerDef, RunParams, drive};
use crate::runtime::permissions::Permission;
use crate::runtime::{queue, scoped_api};

/// The MyDatabase controller, for the operator's table.
pub const CONTROLLER: ControllerDef =
    ControllerDef { name: reconcile::CONTROLLER, rbac: RBAC, run: |params| Box::pin(run(params)) };

/// What the MyDatabase controller does with the API, and nothing more.
pub const RBAC: &[Permission] = &[
    Permission { group: "db.keelson.dev", resources: &["mydatabases"], verbs: &["list", "watch", "patch"] },
    Permission { group: "db.keelson.dev", resources: &["mydatabases/status"], verbs: &["patch"] },
    // Owner references that block deletion need this on the owner.
    Permission { group: "db.keelson.dev", resources: &["mydatabases/finalizers"], verbs: &["update"] },
    Permission {
        group: "apps",
        resources: &["statefulsets"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Permission {
        group: "",
        resources: &["services", "configmaps"],
        verbs: &["get", "list", "watch", "create", "patch"],
    },
    // The credentials Secret is never owned: deleted explicitly under deletionPolicy Delete.
    Permission { group: "", resources: &["secrets"], verbs: &["get", "list", "watch", "create", "patch", "delete"] },
    Permission {
        group: "",
        resources: &["persistentvolumeclaims"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Permission { group: "", resources: &["pods"], verbs: &["list", "watch", "patch", "delete"] },
    // In-place upgrades of the instance manager (`upgrade`): its binary, installed by an ephemeral container.
    Permission { group: "", resources: &["pods/ephemeralcontainers"], verbs: &["patch"] },
    // The instance managers' identity; granting pods/patch needs holding it (above).
    Permission { group: "", resources: &["serviceaccounts"], verbs: &["get", "list", "watch", "create", "patch"] },
    Permission {
        group: "rbac.authorization.k8s.io",
        resources: &["roles", "rolebindings"],
        verbs: &["get", "list", "watch", "create", "patch"],
    },
    Permission {
        group: "batch",
        resources: &["cronjobs"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Permission { group: "batch", resources: &["jobs"], verbs: &["get", "list", "watch", "create", "patch"] },
    Permission {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    // `spec.networkPolicy`: deleted when switched off.
    Permission {
        group: "networking.k8s.io",
        resources: &["networkpolicies"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
];

/// Runs the MyDatabase controller until shutdown.
pub async fn run(params: RunParams) {
    let RunParams { ctx, readiness, namespace, concurrency, on_synced, shutdown } = params;
    let namespace = namespace.as_deref();
    let client = &ctx.client;
    let watch = |kind: &str| cache::Watching {
        health: readiness.watch(format!("{}/{kind}", reconcile::CONTROLLER)),
        streaming_lists: ctx.settings.streaming_lists,
    };
    let (databases, database_events) =
        cache::watch(scoped_api::<MyDatabase>(client, namespace), "", watch("MyDatabase"));
    // A cordoned node (a drain begins): the databases whose primary runs there.
    let (cordoned, cordon_events) =
        ha::drain::watch(kube::Api::all(client.clone()), readiness.watch(format!("{}/Node", reconcile::CONTROLLER)));
    let (caches, child_triggers) = watches::Caches::watch(client, namespace, watch, cordoned);
    let pods_by_node = caches.pods.clone();
    let drains = cordon_events.flat_map(move |node| {
        let pods: Vec<Pod> = pods_by_node
            .state()
            .iter()
            .filter(|p| p.labels().contains_key(names::ROLE_LABEL))
            .filter_map(|p| p.unpack().ok())
            .collect();
        let databases: Vec<ObjectRef<MyDatabase>> =
            ha::drain::primaries_on(&pods, &node).into_iter().filter_map(watches::owning_database).collect();
        stream::iter(databases)
    });
    let triggers = stream::select_all(
        [drains.boxed(), queue::trigger_self(database_events).boxed()].into_iter().chain(child_triggers),
    );
    let reconciler = Arc::new(reconcile::MyDatabaseReconciler { ctx, caches, primaries: Default::default() });
    drive(databases, triggers, reconciler, concurrency, on_synced, shutdown).await;
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
                    storage_class_name: None,
                }),
                restore_from: None,
                restore_to: Vec::new(),
                deletion_policy: DeletionPolicy::Retain,
                replication: Default::default(),
                superuser_access: false,
                tls: None,
                ..Default::default()
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
