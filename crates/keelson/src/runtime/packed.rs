//! A cached child kept small. A k8s-openapi object holds every optional field
//! inline (a Deployment is several KB before its first string); as compact
//! JSON it is about a kilobyte. The cache keeps what the watch, the reflector
//! and the controller's owner mapping read as a struct, and everything else as
//! JSON, decoded only when a reconcile reads the child.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use kube::api::ObjectMeta;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::{Deserialize, Serialize};

/// Whether a kind's cached labels are read without decoding it: a kind the
/// MyDatabase controller lists by label or maps to its database by label.
/// The other kinds keep their labels only in the JSON (a map of strings less
/// per object). Each cached kind says which it is, below.
pub trait LabelsRead {
    const LABELS_READ: bool;
}

impl LabelsRead for Pod {
    const LABELS_READ: bool = true;
}
impl LabelsRead for Job {
    const LABELS_READ: bool = true;
}
impl LabelsRead for PersistentVolumeClaim {
    const LABELS_READ: bool = true;
}
impl LabelsRead for Secret {
    const LABELS_READ: bool = true;
}
impl LabelsRead for Deployment {
    const LABELS_READ: bool = false;
}
impl LabelsRead for Service {
    const LABELS_READ: bool = false;
}
impl LabelsRead for StatefulSet {
    const LABELS_READ: bool = false;
}
impl LabelsRead for ConfigMap {
    const LABELS_READ: bool = false;
}
impl LabelsRead for CronJob {
    const LABELS_READ: bool = false;
}
impl LabelsRead for PodDisruptionBudget {
    const LABELS_READ: bool = false;
}
impl LabelsRead for NetworkPolicy {
    const LABELS_READ: bool = false;
}
impl LabelsRead for ServiceAccount {
    const LABELS_READ: bool = false;
}
impl LabelsRead for Role {
    const LABELS_READ: bool = false;
}
impl LabelsRead for RoleBinding {
    const LABELS_READ: bool = false;
}

/// `K` as the caches hold it: see the module's comment.
pub struct Packed<K> {
    /// Name, namespace, owner references, uid and resourceVersion (what the
    /// watch, the reflector and the controller read), and a copy of the labels
    /// if they are read (`LabelsRead`). Other fields live only in `rest`.
    metadata: ObjectMeta,
    /// The rest of the object as JSON, without `managedFields`.
    rest: Arc<[u8]>,
    /// When this version arrived (was decoded from the watch): how long a
    /// drifted copy waited in the cache before the revert is measured from it.
    arrived: Instant,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource + LabelsRead + Serialize + DeserializeOwned> Packed<K> {
    pub fn pack(mut object: K) -> serde_json::Result<Self> {
        let meta = object.meta_mut();
        meta.managed_fields = None;
        let metadata = ObjectMeta {
            name: meta.name.take(),
            namespace: meta.namespace.take(),
            labels: if K::LABELS_READ { meta.labels.clone() } else { None },
            owner_references: meta.owner_references.take(),
            uid: meta.uid.take(),
            resource_version: meta.resource_version.take(),
            ..ObjectMeta::default()
        };
        let rest = serde_json::to_vec(&object)?.into();
        Ok(Self { metadata, rest, arrived: Instant::now(), kind: PhantomData })
    }

    pub fn arrived(&self) -> Instant {
        self.arrived
    }

    /// The whole object again.
    pub fn unpack(&self) -> serde_json::Result<K> {
        let mut object: K = serde_json::from_slice(&self.rest)?;
        let kept = &self.metadata;
        let meta = object.meta_mut();
        meta.name.clone_from(&kept.name);
        meta.namespace.clone_from(&kept.namespace);
        meta.owner_references.clone_from(&kept.owner_references);
        meta.uid.clone_from(&kept.uid);
        meta.resource_version.clone_from(&kept.resource_version);
        Ok(object)
    }
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self { metadata: self.metadata.clone(), rest: Arc::clone(&self.rest), arrived: self.arrived, kind: PhantomData }
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("kind", &K::kind(&()))
            .field("namespace", &self.metadata.namespace)
            .field("name", &self.metadata.name)
            .field("bytes", &self.rest.len())
            .finish()
    }
}

/// Decoded as `K` straight from the watch, then packed.
impl<'de, K: Resource + LabelsRead + Serialize + DeserializeOwned> Deserialize<'de> for Packed<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::pack(K::deserialize(deserializer)?).map_err(D::Error::custom)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Packed<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    use kube::ResourceExt;

    use super::*;
    use crate::webapp::{deployment, tests::sample};

    fn as_served() -> Deployment {
        let mut served = deployment::build(&sample()).expect("builds");
        let meta = &mut served.metadata;
        meta.uid = Some("0f0e0d0c-0000-4000-8000-000000000002".into());
        meta.resource_version = Some("4711".into());
        meta.generation = Some(3);
        meta.owner_references = Some(vec![OwnerReference { name: "sandy-app".into(), ..Default::default() }]);
        meta.annotations = Some([("deployment.kubernetes.io/revision".to_string(), "1".to_string())].into());
        meta.managed_fields = Some(vec![ManagedFieldsEntry { manager: Some("keelson".into()), ..Default::default() }]);
        served
    }

    #[test]
    fn a_packed_object_unpacks_to_itself_without_managed_fields() {
        let served = as_served();
        let packed = Packed::pack(served.clone()).expect("packs");
        let mut expected = served;
        expected.metadata.managed_fields = None;
        assert_eq!(packed.unpack().expect("unpacks"), expected);
    }

    #[test]
    fn what_the_watch_and_the_controller_read_is_there_without_decoding() {
        let json = serde_json::to_vec(&as_served()).expect("serializes");
        let packed: Packed<Deployment> = serde_json::from_slice(&json).expect("deserializes");
        assert_eq!(packed.name_any(), "sandy-app");
        assert_eq!(packed.namespace().as_deref(), Some("default"));
        assert_eq!(packed.resource_version().as_deref(), Some("4711"));
        assert_eq!(packed.owner_references()[0].name, "sandy-app");
        assert!(packed.managed_fields().is_empty());
        assert_eq!(Packed::<Deployment>::plural(&()), "deployments");
        // Each field is kept once: the JSON's metadata holds only the rest.
        let rest: serde_json::Value = serde_json::from_slice(&packed.rest).expect("JSON");
        let labels = deployment::build(&sample()).expect("builds").metadata.labels;
        assert_eq!(
            rest["metadata"],
            serde_json::json!({
                "annotations": {"deployment.kubernetes.io/revision": "1"},
                "generation": 3,
                "labels": labels,
            })
        );
        // A Deployment's labels are not read from the cache: not kept twice.
        assert!(packed.labels().is_empty());
    }

    #[test]
    fn labels_read_from_the_cache_are_there_without_decoding() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("pg-0".into()),
                labels: Some([("keelson.dev/cluster".to_string(), "pg".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let packed = Packed::pack(pod.clone()).expect("packs");
        assert_eq!(packed.labels().get("keelson.dev/cluster").map(String::as_str), Some("pg"));
        assert_eq!(packed.unpack().expect("unpacks"), pod);
    }
}
