//! Two ways to write back an outsider's scale of a Deployment, compared on the
//! same cluster at the same time (issue 15, item 2): the server-side apply of
//! the whole desired object, and the JSON merge patch of the one field under
//! the same field manager that Keelson sends. Each revert follows the
//! outsider's patch at once, so the Deployment controller is acting on the
//! drift, as in a real revert; each trial starts on a quiet API server, as a
//! drift trial does; the two ways take turns on the same Deployments. Timed
//! from the client (loopback, serialisation included); the ownership each
//! leaves is read from managedFields.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::measure::Summary;

const MANAGER: &str = "keelson";
const OUTSIDER: &str = "bench-outsider";
const DEPLOYMENTS: usize = 10;

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Apply,
    MergePatch,
}

/// What the comparison found: each way's write time, and the managers that own
/// fields of a Deployment after a merge-patch revert.
pub struct Comparison {
    pub apply_ms: Summary,
    pub merge_patch_ms: Summary,
    pub trials_each: usize,
    pub managers_after_merge_patch: Vec<String>,
}

impl Comparison {
    pub fn to_json(&self) -> serde_json::Value {
        let ms =
            |s: &Summary| json!({"p50": crate::round(s.p50), "p99": crate::round(s.p99), "max": crate::round(s.max)});
        json!({
            "trials_each": self.trials_each,
            "apply_ms": ms(&self.apply_ms),
            "merge_patch_ms": ms(&self.merge_patch_ms),
            "managers_after_merge_patch": self.managers_after_merge_patch,
        })
    }
}

/// The Deployment a WebApp `name` gets, in `namespace`, owned by no one and
/// without the managed-by label, so that the operator under test ignores it.
fn desired(namespace: &str, name: &str) -> anyhow::Result<Deployment> {
    let mut app = crate::webapp(0);
    app.metadata.name = Some(name.into());
    app.metadata.namespace = Some(namespace.into());
    app.metadata.uid = Some("00000000-0000-4000-8000-000000000000".into());
    let mut deployment = keelson::webapp::deployment::build(&app)?;
    deployment.metadata.owner_references = None;
    deployment.labels_mut().remove("app.kubernetes.io/managed-by");
    Ok(deployment)
}

pub async fn compare(
    client: &Client,
    namespace: &str,
    trials_each: usize,
    audit_log: &Path,
) -> anyhow::Result<Comparison> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let apply = PatchParams::apply(MANAGER).force();
    let names: Vec<String> = (0..DEPLOYMENTS).map(|i| format!("revert-{i:02}")).collect();
    let mut wanted = Vec::new();
    for name in &names {
        let deployment = desired(namespace, name)?;
        deployments.patch(name, &apply, &Patch::Apply(&deployment)).await?;
        wanted.push(deployment);
    }
    for name in &names {
        crate::settle(&deployments, namespace, name).await?;
    }
    let (mut apply_ms, mut merge_patch_ms) = (Vec::new(), Vec::new());
    let outsider = PatchParams { field_manager: Some(OUTSIDER.into()), ..Default::default() };
    let same_manager = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    for trial in 0..2 * trials_each {
        let way = if trial % 2 == 0 { Way::Apply } else { Way::MergePatch };
        let (name, deployment) = (&names[trial % DEPLOYMENTS], &wanted[trial % DEPLOYMENTS]);
        crate::measure::wait_quiet(audit_log, crate::DRIFT_QUIET, Duration::from_secs(10)).await?;
        deployments.patch(name, &outsider, &Patch::Merge(json!({"spec": {"replicas": 10}}))).await?;
        let sent = Instant::now();
        let reverted = match way {
            Way::Apply => deployments.patch(name, &apply, &Patch::Apply(deployment)).await?,
            Way::MergePatch => {
                deployments.patch(name, &same_manager, &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?
            }
        };
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        if reverted.spec.as_ref().and_then(|s| s.replicas) != Some(1) {
            bail!("{name} was not reverted");
        }
        match way {
            Way::Apply => apply_ms.push(ms),
            Way::MergePatch => merge_patch_ms.push(ms),
        }
        crate::settle(&deployments, namespace, name).await?;
    }
    // A Deployment last reverted by a merge patch (odd trials; the last of them).
    let merged = &names[(2 * trials_each).saturating_sub(1) % DEPLOYMENTS];
    let managers_after_merge_patch = deployments
        .get(merged)
        .await?
        .managed_fields()
        .iter()
        .map(|entry| {
            format!("{} {}", entry.manager.as_deref().unwrap_or("?"), entry.operation.as_deref().unwrap_or("?"))
        })
        .collect();
    Ok(Comparison {
        apply_ms: Summary::of(&apply_ms),
        merge_patch_ms: Summary::of(&merge_patch_ms),
        trials_each,
        managers_after_merge_patch,
    })
}
