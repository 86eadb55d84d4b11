//! The operator with real containers on the local cluster's real node: the
//! tutorial's WebApp serves, drift is taken back with real pods, and a
//! database version without an image is named, not left to ImagePullBackOff.

mod common;

use common::TestOperator;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use keelson::api::MyDatabase;
use keelson::api::webapp::{ServiceType, WebApp, WebAppPhase, WebAppSpec};
use kube::api::{ListParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, cluster_or_skip, eventually, http_get, kubectl, wait_for};

#[tokio::test]
async fn tutorial_webapp_serves_from_real_pods_and_scaling_drift_is_taken_back() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-webapp").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let app = WebApp::new(
        "sandy-app",
        WebAppSpec {
            replicas: 3,
            image: "nginx:1.25-alpine".into(),
            port: 80,
            service_type: ServiceType::NodePort,
            ..Default::default()
        },
    );
    let apps = ns.api::<WebApp>();
    apps.create(&PostParams::default(), &app).await?;
    let running_with_3 = |a: &WebApp| {
        a.status.as_ref().is_some_and(|s| s.phase == Some(WebAppPhase::Running) && s.available_replicas == 3)
    };
    wait_for(&apps, "sandy-app", "Running with 3 real pods", DEFAULT_TIMEOUT, running_with_3).await?;
    let service = ns.api::<Service>().get("sandy-app-service").await?;
    let node_port = service.spec.and_then(|s| s.ports).and_then(|p| p.first()?.node_port).expect("a NodePort");
    let address = format!("127.0.0.1:{node_port}");
    let serves = || async { http_get(&address).await.is_ok_and(|body| body.contains("Welcome to nginx!")) };
    eventually(DEFAULT_TIMEOUT, "the tutorial's nginx to answer on the loopback NodePort", serves).await?;

    kubectl(&["-n", &ns.name, "scale", "deployment", "sandy-app", "--replicas=10"])?;
    let deployments = ns.api::<Deployment>();
    wait_for(&deployments, "sandy-app", "the Deployment back at 3 replicas with 3 available", DEFAULT_TIMEOUT, |d| {
        d.spec.as_ref().and_then(|s| s.replicas) == Some(3)
            && d.status.as_ref().is_some_and(|s| s.replicas == Some(3) && s.available_replicas == Some(3))
    })
    .await?;
    let pods = ns.api::<Pod>();
    eventually(DEFAULT_TIMEOUT, "exactly 3 live nginx pods", || async {
        pods.list(&ListParams::default().labels("app=sandy-app"))
            .await
            .is_ok_and(|list| list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count() == 3)
    })
    .await?;
    wait_for(&apps, "sandy-app", "Running with 3 again", DEFAULT_TIMEOUT, running_with_3).await?;
    eventually(DEFAULT_TIMEOUT, "the tutorial's nginx to answer after the drift", serves).await?;
    Ok(())
}

#[tokio::test]
async fn a_database_version_without_an_image_is_named_in_ready() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-version").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "old-db"},
        "spec": {"replicas": 1, "version": "18.1", "storage": "1Gi"}
    }))?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &db).await?;
    let named = wait_for(&dbs, "old-db", "Ready=False naming spec.version", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "VersionUnavailable")
        })
    })
    .await?;
    let message = named.status.map(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "Ready");
    let message = message.map(|c| c.message).unwrap_or_default();
    assert!(message.starts_with("spec.version \"18.1\": image postgres:18.1 is not available"), "{message}");
    Ok(())
}
