//! The generated manager Deployment is admitted under the `restricted` Pod
//! Security Standard and its pod is scheduled and Running (kwok stands in for
//! the kubelet: the image itself cannot run here).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use keelson::manifests::deploy;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, cluster_or_skip, wait_for};

#[tokio::test]
async fn manager_runs_in_a_restricted_namespace() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("deploy-restricted").await?;
    let labels = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}});
    Api::<Namespace>::all(cluster.client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;

    // Enforcement is real: a pod that breaks the standard is refused.
    let privileged: Pod = serde_json::from_value(json!({"metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true}}]}}))?;
    let refused = ns.api::<Pod>().create(&PostParams::default(), &privileged).await;
    assert!(format!("{refused:?}").contains("violates PodSecurity"), "{refused:?}");

    let mut sa = deploy::service_account();
    sa.metadata.namespace = Some(ns.name.clone());
    ns.api::<ServiceAccount>().create(&PostParams::default(), &sa).await?;
    let mut manager = deploy::manager_deployment(deploy::IMAGE);
    manager.metadata.namespace = Some(ns.name.clone());
    let name = manager.metadata.name.clone().unwrap_or_default();
    ns.api::<Deployment>().create(&PostParams::default(), &manager).await?;
    wait_for(&ns.api::<Deployment>(), &name, "the manager pod Running", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
    })
    .await?;
    Ok(())
}
