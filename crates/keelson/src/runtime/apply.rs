//! Brings one child object to its desired state with server-side apply,
//! writing only when a managed field differs.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::context::FIELD_MANAGER;
use super::drift::{self, FieldDrift};
use super::metrics::Metrics;
use crate::{Error, Result};

/// Annotation holding a hash of what Keelson last applied, so a spec change
/// (ours) can be told apart from drift (someone else's).
pub const DESIRED_HASH_ANNOTATION: &str = "keelson.dev/desired-hash";

/// What applying a child did.
#[derive(Debug, PartialEq)]
pub enum ChildChange {
    Unchanged,
    Created,
    /// The spec asked for something new.
    Updated(Vec<FieldDrift>),
    /// Someone else changed fields Keelson manages; they were set back.
    DriftCorrected(Vec<FieldDrift>),
}

/// 64-bit FNV-1a: stable across builds, unlike `std`'s hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100000001b3))
}

/// Stamps `desired` with the hash of its own content.
pub fn stamp_desired_hash<K: Resource + Serialize>(desired: &mut K) -> Result<()> {
    let json = serde_json::to_vec(desired).map_err(|source| Error::Serialize { what: "desired child", source })?;
    let hash = format!("{:016x}", fnv1a(&json));
    desired.meta_mut().annotations.get_or_insert_with(Default::default).insert(DESIRED_HASH_ANNOTATION.into(), hash);
    Ok(())
}

fn desired_hash<K: Resource>(object: &K) -> Option<&String> {
    object.meta().annotations.as_ref().and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
}

async fn read<K>(api: &Api<K>, name: &str, metrics: &Metrics) -> Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let actual = api.get_opt(name).await;
    metrics.api_request("get", &actual);
    actual.map_err(Error::kube(format!("get {} {name}", K::kind(&()))))
}

/// Compares `actual` to `desired` (already stamped) and says what applying would be.
pub fn classify<K: Resource + Serialize>(desired: &K, actual: Option<&K>) -> Result<ChildChange> {
    let Some(actual) = actual else {
        return Ok(ChildChange::Created);
    };
    let want = serde_json::to_value(desired).map_err(|source| Error::Serialize { what: "desired child", source })?;
    let have = serde_json::to_value(actual).map_err(|source| Error::Serialize { what: "actual child", source })?;
    let drifts = drift::diff(&want, &have);
    Ok(if drifts.is_empty() {
        ChildChange::Unchanged
    } else if desired_hash(actual) == desired_hash(desired) {
        ChildChange::DriftCorrected(drifts)
    } else {
        ChildChange::Updated(drifts)
    })
}

/// What the caller knows of a child's current state.
pub enum Current<'a, K: Resource<DynamicType = ()> + Clone + 'static> {
    /// Nothing: read it from the API server.
    Unknown,
    /// A watch cache; trusted only to say "nothing to do", anything else is
    /// confirmed with the API server (the cache may lag behind our last write).
    Cached(&'a Store<K>),
    /// Just read from the API server by the caller.
    Read(Option<K>),
}

/// Brings a child to `desired`, applying only if it is missing or differs.
pub async fn apply_child<K>(
    api: &Api<K>,
    mut desired: K,
    current: Current<'_, K>,
    metrics: &Metrics,
) -> Result<(K, ChildChange)>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + 'static,
{
    let kind = K::kind(&());
    let name = desired.meta().name.clone().unwrap_or_default();
    stamp_desired_hash(&mut desired)?;
    let actual = match current {
        Current::Read(actual) => actual,
        Current::Cached(cache) => {
            let key = ObjectRef::new(&name).within(desired.meta().namespace.as_deref().unwrap_or_default());
            if let Some(cached) = cache.get(&key)
                && classify(&desired, Some(&cached))? == ChildChange::Unchanged
            {
                return Ok((K::clone(&cached), ChildChange::Unchanged));
            }
            read(api, &name, metrics).await?
        }
        Current::Unknown => read(api, &name, metrics).await?,
    };
    let change = classify(&desired, actual.as_ref())?;
    if let (ChildChange::Unchanged, Some(actual)) = (&change, actual) {
        return Ok((actual, ChildChange::Unchanged));
    }
    let applied = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired)).await;
    metrics.api_request("apply", &applied);
    let applied = applied.map_err(Error::kube(format!("apply {kind} {name}")))?;
    Ok((applied, change))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn config_map(value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some("c".into()), ..Default::default() },
            data: Some([("k".to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    fn stamped(value: &str) -> ConfigMap {
        let mut cm = config_map(value);
        stamp_desired_hash(&mut cm).expect("serializable");
        cm
    }

    #[test]
    fn missing_child_is_created() {
        assert_eq!(classify(&stamped("a"), None).expect("ok"), ChildChange::Created);
    }

    #[test]
    fn equal_child_is_unchanged() {
        let desired = stamped("a");
        assert_eq!(classify(&desired, Some(&desired.clone())).expect("ok"), ChildChange::Unchanged);
    }

    #[test]
    fn outside_edit_is_drift_and_spec_change_is_update() {
        let desired = stamped("a");
        let mut edited = desired.clone();
        edited.data = Some([("k".to_string(), "b".to_string())].into());
        assert!(
            matches!(classify(&desired, Some(&edited)).expect("ok"), ChildChange::DriftCorrected(d) if d[0].path == "data.k")
        );
        let new_desired = stamped("c");
        assert!(matches!(classify(&new_desired, Some(&desired)).expect("ok"), ChildChange::Updated(_)));
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(stamped("a").metadata.annotations, stamped("a").metadata.annotations);
        assert_ne!(stamped("a").metadata.annotations, stamped("b").metadata.annotations);
    }
}
