//! Writing status: only through the status subresource, and only when it changed.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::Context;
use super::metrics::ControllerLabels;
use crate::{Error, Result};

/// Now, to the second: the API server stores condition times in seconds, so a
/// finer time would make every computed status differ from the stored one.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now))
}

/// How [`crate::runtime::status_writes::StatusWrites`] knows an object: `controller/namespace/name`.
pub fn key<K: Resource>(controller: &str, object: &K) -> String {
    super::meta::key(controller, object.namespace().as_deref(), &object.name_any())
}

/// Writes `new` when it differs from `current`; true when it wrote. A write
/// changes the object, which triggers another reconcile, so an unchanged
/// status must never be written (that would loop), nor one we wrote that
/// the cached object does not show yet.
pub async fn write_if_changed<K, S>(
    ctx: &Context,
    controller: &'static str,
    object: &K,
    current: Option<&S>,
    new: &S,
) -> Result<bool>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    S: Serialize + PartialEq,
{
    if current == Some(new) {
        return Ok(false);
    }
    let namespace = object.namespace().unwrap_or_default();
    let key = key(controller, object);
    let status = serde_json::to_string(new).map_err(|source| Error::Serialize { what: "status", source })?;
    // Hashed once: compared before the write, remembered after it.
    let digest = super::status_writes::status_digest(&status);
    if ctx.status_writes.not_yet_seen(&key, digest, object.resource_version().as_deref()) {
        return Ok(false);
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    // The whole status, as computed: a merge patch would keep fields that are gone
    // from the new one (a record's field that is None now, merged into the last record).
    let patch = json!([{ "op": "add", "path": "/status", "value": new }]);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|source| Error::Serialize { what: "status patch", source })?;
    let result = api.patch_status(&object.name_any(), &PatchParams::default(), &Patch::Json::<()>(patch)).await;
    ctx.metrics.status_writes.get_or_create(&ControllerLabels { controller }).inc();
    let written =
        result.map_err(Error::kube(format!("write status of {} {namespace}/{}", K::kind(&()), object.name_any())))?;
    tracing::debug!(namespace, name = %object.name_any(), %status, "status written");
    ctx.status_writes.record(key, digest, written.resource_version());
    Ok(true)
}
