//! Reliability under control-plane failure: the operator process keeps
//! working through an API-server restart, and says when it cannot.
//! Its own test binary: stopping the API server would break tests running
//! beside it.

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use keelson::api::MyDatabase;
use keelson::api::webapp::{ServiceType, WebApp, WebAppPhase, WebAppSpec};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::control_plane::ControlPlane;
use testkit::process::{OperatorProcess, service_account_kubeconfig};
use testkit::{DEFAULT_TIMEOUT, cluster_or_skip, eventually, wait_for};

const BINARY: &str = env!("CARGO_BIN_EXE_keelson");
/// What the operator promises after the API server answers again (docs/reliability.md).
const RECOVERY: Duration = Duration::from_secs(10);

#[tokio::test]
async fn drift_and_new_objects_are_handled_right_after_an_api_server_restart() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let Some(plane) = ControlPlane::of_kubeconfig() else {
        anyhow::ensure!(std::env::var("CI").is_err(), "CI must run against the dev cluster");
        eprintln!("skipped: KUBECONFIG is not a Keelson dev cluster; its API server cannot be restarted");
        return Ok(());
    };
    let ns = common::namespace(&cluster, "api-restart").await?;
    common::grant_operator_rbac(&cluster, &ns).await?;
    let dir = std::env::temp_dir();
    let kubeconfig = service_account_kubeconfig(&ns.name, common::OPERATOR_SA, &dir)?;
    let operator = OperatorProcess::start(
        BINARY.as_ref(),
        &kubeconfig,
        "keelson-api-restart",
        &["--namespace", ns.name.as_str(), "--log-format", "json"],
        &dir,
    )?;
    eventually(DEFAULT_TIMEOUT, "/readyz to answer 200", || async {
        operator.health("/readyz").await.is_ok_and(|(c, _)| c == 200)
    })
    .await?;
    let app = WebApp::new(
        "survivor",
        WebAppSpec {
            replicas: 2,
            image: "nginx:1.25-alpine".into(),
            port: 80,
            service_type: ServiceType::NodePort,
            ..Default::default()
        },
    );
    ns.api::<WebApp>().create(&PostParams::default(), &app).await?;
    wait_for(&ns.api::<WebApp>(), "survivor", "Running", DEFAULT_TIMEOUT, |a| {
        a.status.as_ref().is_some_and(|s| s.phase == Some(WebAppPhase::Running))
    })
    .await?;

    plane.stop("kube-apiserver")?;
    let outage = async {
        eventually(Duration::from_secs(60), "/readyz to fail while the API server is down", || async {
            operator.health("/readyz").await.is_ok_and(|(c, _)| c == 503)
        })
        .await?;
        let (code, _) = operator.health("/healthz").await?;
        anyhow::ensure!(code == 200, "/healthz must stay 200 (a restart would not help), got {code}");
        anyhow::Ok(())
    }
    .await;
    // The API server comes back whatever the outage part found.
    plane.start("kube-apiserver")?;
    outage?;
    let back = Instant::now();

    // An outsider's change right after recovery is taken back...
    let deployments = ns.api::<Deployment>();
    let scale = json!({"spec": {"replicas": 9}});
    eventually(DEFAULT_TIMEOUT, "the scale to be accepted", || async {
        deployments.patch("survivor", &PatchParams::default(), &Patch::Merge(&scale)).await.is_ok()
    })
    .await?;
    wait_for(&deployments, "survivor", "replicas set back to 2", DEFAULT_TIMEOUT, |d| {
        d.spec.as_ref().and_then(|s| s.replicas) == Some(2)
    })
    .await?;
    let drift_reverted = back.elapsed();

    // ...and a MyDatabase created right after it is reconciled.
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "after-restart"},
        "spec": {"replicas": 1, "version": "15.2", "storage": "1Gi"}
    }))?;
    let created = Instant::now();
    ns.api::<MyDatabase>().create(&PostParams::default(), &db).await?;
    wait_for(&ns.api::<StatefulSet>(), "after-restart", "its StatefulSet", DEFAULT_TIMEOUT, |s| {
        s.owner_references().iter().any(|o| o.name == "after-restart")
    })
    .await?;
    let database_reconciled = created.elapsed();
    let ready_again = eventually(DEFAULT_TIMEOUT, "/readyz to answer 200 again", || async {
        operator.health("/readyz").await.is_ok_and(|(c, _)| c == 200)
    })
    .await;
    if let Err(error) = ready_again {
        let readyz = operator.health("/readyz").await.map(|(_, body)| body).unwrap_or_default();
        anyhow::bail!("{error}: /readyz says {readyz}\nlog:\n{}", operator.log_text());
    }
    eprintln!(
        "after the API server was ready again: drift reverted in {:.1} s, a new MyDatabase reconciled in {:.1} s",
        drift_reverted.as_secs_f64(),
        database_reconciled.as_secs_f64()
    );
    anyhow::ensure!(
        drift_reverted <= RECOVERY,
        "drift reverted {drift_reverted:?} after the API server was back (promise: {RECOVERY:?}); log:\n{}",
        operator.log_text()
    );
    Ok(())
}
