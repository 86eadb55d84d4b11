//! Every kind the MyDatabase controller watches and caches, listed once: the
//! `Caches` field, its kind, which of its objects are watched, and how an event
//! finds its MyDatabase. The macro turns the list into the `Caches` struct, the
//! watches that fill it, the wait for their first lists and, in tests, empty
//! caches. (The nodes a drain cordons are watched apart: see `drain`.)

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::{Client, Resource};

use super::ha::drain::Cordoned;
use super::names;
use crate::api::MyDatabase;
use crate::runtime::cache::{self, Packed, Watching};
use crate::runtime::{meta, queue, scoped_api};

/// Which objects of a kind are watched.
enum Selection {
    /// Everything Keelson manages of that kind.
    Managed,
    /// Managed objects of these `app.kubernetes.io/component` values.
    Components(&'static str),
}

impl Selection {
    fn labels(&self) -> String {
        let managed = meta::managed_selector(names::APP_NAME);
        match self {
            Selection::Managed => managed,
            Selection::Components(components) => format!("{managed},app.kubernetes.io/component in ({components})"),
        }
    }
}

/// The MyDatabase a labelled object (a backup Job, a pod, a volume) belongs to.
pub fn owning_database<K: Resource>(object: &K) -> Option<ObjectRef<MyDatabase>> {
    let cluster = object.meta().labels.as_ref()?.get(names::CLUSTER_LABEL)?.clone();
    Some(ObjectRef::<MyDatabase>::new(&cluster).within(object.meta().namespace.as_deref()?))
}

/// A child's event for the MyDatabase that controls it (owner reference).
fn by_owner<K: Resource + Send + 'static>(
    events: impl Stream<Item = Event<K>> + Send + 'static,
) -> BoxStream<'static, ObjectRef<MyDatabase>> {
    queue::trigger_owners(events).boxed()
}

/// An event for the MyDatabase its labels name (pods, Jobs, volumes and the
/// credentials belong to the StatefulSet, a CronJob or no one).
fn by_label<K: Resource + Send + 'static>(
    events: impl Stream<Item = Event<K>> + Send + 'static,
) -> BoxStream<'static, ObjectRef<MyDatabase>> {
    queue::trigger_with(events, |object: &K| owning_database(object)).boxed()
}

macro_rules! watched_kinds {
    ($($field:ident: $kind:ty, $what:literal, $selection:expr, $route:ident;)*) => {
        /// The caches of everything a MyDatabase owns or watches, filled by its watches.
        pub struct Caches {
            $(pub $field: Store<Packed<$kind>>,)*
            /// The nodes cordoned now: a drain takes the primary's pod soon.
            pub cordoned: Cordoned,
        }

        impl Caches {
            /// Starts one watch per kind (in `namespace`, or everywhere): the caches, and the
            /// MyDatabases their events concern. `watching` names a watch for its health.
            pub fn watch(
                client: &Client,
                namespace: Option<&str>,
                watching: impl Fn(&str) -> Watching,
                cordoned: Cordoned,
            ) -> (Self, Vec<BoxStream<'static, ObjectRef<MyDatabase>>>) {
                let mut triggers = Vec::new();
                $(
                    let (store, events) = cache::watch(
                        scoped_api::<Packed<$kind>>(client, namespace),
                        &$selection.labels(),
                        watching(stringify!($kind)),
                    );
                    triggers.push($route(events));
                    let $field = store;
                )*
                (Self { $($field,)* cordoned }, triggers)
            }

            /// Until every cache has its first full list (at once afterwards): a
            /// reconcile must not take an unsynced cache's emptiness for the cluster's.
            /// Bounded: a watch that cannot list is an error naming it, not a hang.
            pub async fn synced(&self) -> crate::Result<()> {
                $(cache::synced(&self.$field, $what).await?;)*
                Ok(())
            }

            /// Caches that hold nothing, listed (tests set the ones they need).
            #[cfg(test)]
            pub fn empty() -> Self {
                Self { $($field: crate::runtime::fake_api::cache(vec![]),)* cordoned: Cordoned::default() }
            }
        }
    };
}

watched_kinds! {
    statefulsets: StatefulSet, "StatefulSets", Selection::Managed, by_owner;
    services: Service, "Services", Selection::Managed, by_owner;
    secrets: Secret, "Secrets", Selection::Managed, by_label;
    config_maps: ConfigMap, "ConfigMaps", Selection::Managed, by_owner;
    cron_jobs: CronJob, "CronJobs", Selection::Managed, by_owner;
    disruption_budgets: PodDisruptionBudget, "PodDisruptionBudgets", Selection::Managed, by_owner;
    network_policies: NetworkPolicy, "NetworkPolicies", Selection::Managed, by_owner;
    jobs: Job, "Jobs", Selection::Components("backup,restore"), by_label;
    claims: PersistentVolumeClaim, "PersistentVolumeClaims", Selection::Managed, by_label;
    // Database pods; backup and restore pods for what their termination message reports.
    pods: Pod, "Pods", Selection::Components("database,backup,restore"), by_label;
    service_accounts: ServiceAccount, "ServiceAccounts", Selection::Managed, by_owner;
    roles: Role, "Roles", Selection::Managed, by_owner;
    role_bindings: RoleBinding, "RoleBindings", Selection::Managed, by_owner;
}
