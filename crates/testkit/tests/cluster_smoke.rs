//! The local control plane does what the operator's tests rely on.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, cluster_or_skip, eventually, wait_for, wait_for_deletion};

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> anyhow::Result<T> {
    Ok(serde_json::from_value(value)?)
}

#[tokio::test]
async fn deployment_of_three_becomes_available() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("smoke-deployment").await?;
    let deployments = ns.api::<Deployment>();
    let deployment: Deployment = from_json(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))?;
    deployments.create(&PostParams::default(), &deployment).await?;
    wait_for(&deployments, "web", "3 available replicas", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().and_then(|s| s.available_replicas) == Some(3)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn statefulset_with_volume_claims_becomes_ready_with_bound_pvcs() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("smoke-statefulset").await?;
    let sets = ns.api::<StatefulSet>();
    let set: StatefulSet = from_json(json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "postgres"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}
    }))?;
    sets.create(&PostParams::default(), &set).await?;
    wait_for(&sets, "db", "2 ready replicas", DEFAULT_TIMEOUT, |s| {
        s.status.as_ref().and_then(|s| s.ready_replicas) == Some(2)
    })
    .await?;
    let claims = ns.api::<PersistentVolumeClaim>().list(&ListParams::default()).await?;
    assert_eq!(claims.items.len(), 2);
    for claim in claims.items {
        assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    }
    Ok(())
}

#[tokio::test]
async fn job_completes() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("smoke-job").await?;
    let jobs = ns.api::<Job>();
    let job: Job = from_json(json!({
        "metadata": {"name": "once"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    jobs.create(&PostParams::default(), &job).await?;
    wait_for(&jobs, "once", "1 succeeded pod", DEFAULT_TIMEOUT, |j| {
        j.status.as_ref().and_then(|s| s.succeeded) == Some(1)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn garbage_collector_deletes_owned_objects() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("smoke-gc").await?;
    let maps = ns.api::<ConfigMap>();
    let owner = maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta { name: Some("owner".into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await?;
    let owner_ref = owner.controller_owner_ref(&()).ok_or_else(|| anyhow::anyhow!("owner has no uid"))?;
    let owned = ConfigMap {
        metadata: ObjectMeta {
            name: Some("owned".into()),
            owner_references: Some(vec![owner_ref]),
            ..Default::default()
        },
        ..Default::default()
    };
    maps.create(&PostParams::default(), &owned).await?;
    maps.delete("owner", &DeleteParams::background()).await?;
    wait_for_deletion(&maps, "owned", "the garbage collector to delete the owned ConfigMap", DEFAULT_TIMEOUT).await?;
    Ok(())
}

#[tokio::test]
async fn rbac_is_enforced_for_service_accounts() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = cluster.namespace("smoke-rbac").await?;
    let pp = PostParams::default();
    ns.api::<ServiceAccount>()
        .create(
            &pp,
            &ServiceAccount {
                metadata: ObjectMeta { name: Some("reader".into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await?;
    let role = Role {
        metadata: ObjectMeta { name: Some("configmap-reader".into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..Default::default()
        }]),
    };
    ns.api::<Role>().create(&pp, &role).await?;
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("reader".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "configmap-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.name.clone()),
            ..Default::default()
        }]),
    };
    ns.api::<RoleBinding>().create(&pp, &binding).await?;

    let reader = cluster.client_as_service_account(&ns.name, "reader")?;
    let configmaps: Api<ConfigMap> = Api::namespaced(reader.clone(), &ns.name);
    // The authorizer learns of a new RoleBinding from its watch: wait until the grant applies.
    eventually(DEFAULT_TIMEOUT, "the new RoleBinding to take effect", || async {
        configmaps.list(&ListParams::default()).await.is_ok()
    })
    .await?;
    let secrets: Api<Secret> = Api::namespaced(reader.clone(), &ns.name);
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("listing Secrets should be forbidden, got {other:?}"),
    }
    let write = configmaps
        .create(
            &pp,
            &ConfigMap { metadata: ObjectMeta { name: Some("x".into()), ..Default::default() }, ..Default::default() },
        )
        .await;
    assert!(matches!(write, Err(kube::Error::Api(ref s)) if s.code == 403), "create should be forbidden: {write:?}");
    Ok(())
}
