//! Metadata every child carries: the recommended labels, the owner
//! reference, and label selectors, each built in this one place.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::{Error, Result};

/// `Kind/namespace/name`: how the backoff and [`super::own_writes::OwnWrites`] know an object.
pub fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    key(&K::kind(&()), object.namespace().as_deref(), &object.name_any())
}

/// `prefix/namespace/name`, the one shape of every per-object key this process keeps.
pub fn key(prefix: &str, namespace: Option<&str>, name: &str) -> String {
    format!("{prefix}/{}/{name}", namespace.unwrap_or_default())
}

/// Label every object Keelson manages carries; owned watches select on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "keelson");

/// An environment variable from the pod's own metadata (the downward API), e.g. `metadata.name`.
pub fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Labels on every child object, after the Kubernetes recommended labels.
pub fn recommended_labels(app_name: &str, component: &str, instance: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", app_name),
        ("app.kubernetes.io/instance", instance),
        ("app.kubernetes.io/component", component),
        MANAGED_BY,
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `key=value,...` for a label map, as list and watch requests take it.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Selector matching the objects Keelson manages for one controller (its
/// `app.kubernetes.io/name`), for its owned watches: neither controller
/// caches the other's children.
pub fn managed_selector(app_name: &str) -> String {
    format!("{}={},app.kubernetes.io/name={app_name}", MANAGED_BY.0, MANAGED_BY.1)
}

/// True when `labels` holds every pair of `wanted`.
pub fn matches(labels: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Metadata of a child named `name` in the owner's namespace, without an owner.
pub fn unowned<K: Resource>(owner: &K, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta { name: Some(name), namespace: owner.namespace(), labels: Some(labels), ..Default::default() }
}

/// Metadata of a child controlled by `owner`, garbage-collected with it.
pub fn owned<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: String,
    labels: BTreeMap<String, String>,
) -> Result<ObjectMeta> {
    let reference = owner
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingMetadata(format!("{} {} has no uid yet", K::kind(&()), owner.name_any())))?;
    Ok(ObjectMeta { owner_references: Some(vec![reference]), ..unowned(owner, name, labels) })
}

/// A name derived from the custom resource's, and the limit Kubernetes puts on it.
#[derive(Clone, Copy, Debug)]
pub struct DerivedName {
    /// What the custom resource's name becomes, e.g. `{}-service`.
    pub suffix: &'static str,
    /// Extra characters Kubernetes adds on its own, e.g. a revision hash.
    pub added_by_kubernetes: usize,
    pub limit: usize,
    /// Where the limit comes from.
    pub what: &'static str,
}

/// The longest name a custom resource may have so that every derived name
/// fits, and the derived name that sets it.
pub fn max_name_length(derived: &[DerivedName]) -> (usize, DerivedName) {
    let tightest = derived
        .iter()
        .copied()
        .min_by_key(|d| d.limit.saturating_sub(d.suffix.len() + d.added_by_kubernetes))
        .unwrap_or(DerivedName { suffix: "", added_by_kubernetes: 0, limit: 253, what: "an object name" });
    (tightest.limit.saturating_sub(tightest.suffix.len() + tightest.added_by_kubernetes), tightest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_is_sorted_and_matches() {
        let labels: BTreeMap<String, String> = [("b".to_string(), "2".to_string()), ("a".into(), "1".into())].into();
        assert_eq!(selector(&labels), "a=1,b=2");
        let mut more = labels.clone();
        more.insert("c".into(), "3".into());
        assert!(matches(&more, &labels));
        assert!(!matches(&labels, &more));
    }
}
