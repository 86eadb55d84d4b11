//! The `keelson` binary as it runs in production: probes, metrics, clean
//! shutdown on SIGTERM, and leader election between two processes.

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use keelson::api::webapp::{ServiceType, WebApp, WebAppPhase, WebAppSpec};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testkit::process::{OperatorProcess, service_account_kubeconfig};
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, wait_for};

const BINARY: &str = env!("CARGO_BIN_EXE_keelson");

fn app(name: &str) -> WebApp {
    WebApp::new(
        name,
        WebAppSpec {
            replicas: 2,
            image: "nginx:1.25-alpine".into(),
            port: 80,
            service_type: ServiceType::NodePort,
            ..Default::default()
        },
    )
}

async fn running(ns: &TestNamespace, name: &str) -> anyhow::Result<()> {
    wait_for(&ns.api::<WebApp>(), name, "Running", DEFAULT_TIMEOUT, |a| {
        a.status.as_ref().is_some_and(|s| s.phase == Some(WebAppPhase::Running) && s.available_replicas == 2)
    })
    .await
    .map(|_| ())
}

fn start(ns: &TestNamespace, identity: &str, extra: &[&str]) -> anyhow::Result<OperatorProcess> {
    let dir = std::env::temp_dir();
    let kubeconfig = service_account_kubeconfig(&ns.name, common::OPERATOR_SA, &dir)?;
    let mut args = vec!["--namespace", ns.name.as_str(), "--log-format", "json"];
    args.extend_from_slice(extra);
    OperatorProcess::start(BINARY.as_ref(), &kubeconfig, identity, &args, &dir)
}

#[tokio::test]
async fn probes_metrics_and_clean_shutdown_on_sigterm() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "process-probes").await?;
    common::grant_operator_rbac(&cluster, &ns).await?;
    let mut operator = start(&ns, "keelson-probes", &[])?;

    eventually(DEFAULT_TIMEOUT, "/readyz to answer 200", || async {
        operator.health("/readyz").await.is_ok_and(|(c, _)| c == 200)
    })
    .await?;
    assert_eq!(operator.health("/healthz").await?, (200, "ok".to_string()));

    ns.api::<WebApp>().create(&PostParams::default(), &app("probed")).await?;
    running(&ns, "probed").await?;
    let series = [
        "keelson_reconcile_total{controller=\"webapp\"}",
        "keelson_reconcile_duration_seconds_bucket{",
        "keelson_child_writes_total{kind=\"Deployment\",action=\"create\"} 1",
        "keelson_leader 1",
        "keelson_kubernetes_http_requests_total{verb=\"watch\",code=\"200\"}",
        "keelson_kubernetes_http_requests_total{verb=\"patch\",code=\"200\"}",
    ];
    // The status write that made the WebApp Running is counted when its answer arrives,
    // which may be after the test saw the status.
    let shown = eventually(DEFAULT_TIMEOUT, "/metrics to show every series", || async {
        operator.metrics().await.is_ok_and(|metrics| series.iter().all(|s| metrics.contains(s)))
    })
    .await;
    if shown.is_err() {
        let metrics = operator.metrics().await?;
        let missing: Vec<&&str> = series.iter().filter(|s| !metrics.contains(*s)).collect();
        anyhow::bail!("/metrics lacks {missing:?}:\n{metrics}");
    }

    operator.signal("TERM")?;
    let status = operator.wait_exit(Duration::from_secs(30)).await?;
    assert!(status.success(), "exit status {status:?}; log:\n{}", operator.log_text());
    assert!(operator.log_text().contains("stopped cleanly"), "{}", operator.log_text());
    Ok(())
}

/// Records every change of the Lease's holder: (holder, when seen).
fn record_lease(
    ns: &TestNamespace,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<Vec<(String, Instant)>> {
    let leases = ns.api::<Lease>();
    tokio::spawn(async move {
        let mut history: Vec<(String, Instant)> = Vec::new();
        let stream =
            watcher(leases, watcher::Config::default().fields("metadata.name=keelson-leader")).applied_objects();
        let mut stream = std::pin::pin!(stream.take_until(stop));
        while let Some(Ok(lease)) = stream.next().await {
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            if history.last().map(|(h, _)| h) != Some(&holder) {
                history.push((holder, Instant::now()));
            }
        }
        history
    })
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_successor_takes_over() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "process-leader").await?;
    common::grant_operator_rbac(&cluster, &ns).await?;
    let (stop_recording, stop) = tokio::sync::oneshot::channel();
    let history = record_lease(&ns, stop);
    let lease_ns = ["--leader-elect", "--leader-election-namespace", ns.name.as_str()];

    let first = start(&ns, "keelson-a", &lease_ns)?;
    eventually(DEFAULT_TIMEOUT, "keelson-a to lead", || async { first.metric("keelson_leader").await == 1.0 }).await?;
    let second = start(&ns, "keelson-b", &lease_ns)?;
    eventually(DEFAULT_TIMEOUT, "keelson-b to serve metrics", || async { second.metrics().await.is_ok() }).await?;

    ns.api::<WebApp>().create(&PostParams::default(), &app("led")).await?;
    running(&ns, "led").await?;
    assert!(first.metric("keelson_reconcile_total").await >= 1.0);
    assert_eq!(second.metric("keelson_leader").await, 0.0, "two leaders");
    assert_eq!(second.metric("keelson_reconcile_total").await, 0.0, "the follower reconciled");

    // kill -9: no release. The follower takes over once the lease expires (15 s).
    first.signal("KILL")?;
    let killed = Instant::now();
    eventually(Duration::from_secs(60), "keelson-b to lead", || async { second.metric("keelson_leader").await == 1.0 })
        .await?;
    let takeover = killed.elapsed();
    eprintln!("takeover after kill -9: {takeover:?}");
    assert!(takeover <= Duration::from_secs(15 + 2 + 5), "takeover took {takeover:?}");

    // The new leader does the work: drift is set back again.
    ns.api::<Deployment>()
        .patch("led", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 7}})))
        .await?;
    wait_for(&ns.api::<Deployment>(), "led", "replicas back at 2", DEFAULT_TIMEOUT, |d| {
        d.spec.as_ref().and_then(|s| s.replicas) == Some(2)
    })
    .await?;
    eventually(DEFAULT_TIMEOUT, "keelson-b to record the drift", || async {
        second.metric("keelson_drift_corrections_total").await >= 1.0
    })
    .await?;

    // A graceful stop releases the lease, so a third instance starts at once.
    let mut second = second;
    let third = start(&ns, "keelson-c", &lease_ns)?;
    eventually(DEFAULT_TIMEOUT, "keelson-c to serve metrics", || async { third.metrics().await.is_ok() }).await?;
    second.signal("TERM")?;
    let released = Instant::now();
    assert!(second.wait_exit(Duration::from_secs(30)).await?.success());
    eventually(Duration::from_secs(60), "keelson-c to lead", || async { third.metric("keelson_leader").await == 1.0 })
        .await?;
    let handover = released.elapsed();
    eprintln!("handover after SIGTERM: {handover:?}");
    assert!(handover < Duration::from_secs(10), "a released lease took {handover:?} to move");
    assert!(second.log_text().contains("released the leader Lease"), "{}", second.log_text());

    // The Lease's history: one holder at a time, b only after a's lease ran out.
    let _ = stop_recording.send(());
    let history: Vec<(String, Instant)> = history.await?.into_iter().filter(|(h, _)| !h.is_empty()).collect();
    let holders: Vec<&str> = history.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(holders, ["keelson-a", "keelson-b", "keelson-c"], "lease history {holders:?}");
    let b_acquired = history[1].1;
    assert!(
        b_acquired.duration_since(killed) >= Duration::from_secs(10),
        "keelson-b took a lease that had not expired"
    );
    let lease = ns.api::<Lease>().get("keelson-leader").await?.spec.unwrap_or_default();
    assert!(lease.lease_transitions.unwrap_or(0) >= 2, "{lease:?}");
    drop(third);
    Ok(())
}

/// `curl` of the operator's HTTPS `/metrics` with `token` (if any): the status code and body.
fn curl_metrics(port: u16, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let mut command = std::process::Command::new("curl");
    command.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let output = command.arg(format!("https://127.0.0.1:{port}/metrics")).output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// `--metrics-secure`: HTTPS only, and only for a token the API server accepts
/// whose user may `get /metrics` (the ClusterRole keelson-metrics-reader).
#[tokio::test]
async fn secure_metrics_serve_only_tokens_allowed_to_read_them() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "process-secure-metrics").await?;
    common::grant_operator_rbac(&cluster, &ns).await?;
    for account in ["scraper", "stranger"] {
        testkit::kubectl(&["-n", &ns.name, "create", "serviceaccount", account])?;
    }
    common::bind_cluster_wide(&cluster, &ns, keelson::manifests::rbac::METRICS_READER_ROLE_NAME, "scraper").await?;
    let token = |account: &str| -> anyhow::Result<String> {
        Ok(testkit::kubectl(&["-n", &ns.name, "create", "token", account, "--duration=10m"])?.trim().to_string())
    };
    let (scraper, stranger) = (token("scraper")?, token("stranger")?);
    let operator = start(&ns, "keelson-secure-metrics", &["--metrics-secure"])?;
    let port = operator.metrics_port;
    // Served once the scraper's right has reached the authorizer's cache.
    let served = eventually(DEFAULT_TIMEOUT, "/metrics over HTTPS for the scraper", || async {
        curl_metrics(port, Some(&scraper)).is_ok_and(|(code, body)| code == 200 && body.contains("keelson_build_info"))
    })
    .await;
    if served.is_err() {
        anyhow::bail!("{:?}; log:\n{}", curl_metrics(port, Some(&scraper)), operator.log_text());
    }
    assert_eq!(curl_metrics(port, None)?.0, 401, "no token");
    assert_eq!(curl_metrics(port, Some("not-a-token"))?.0, 401, "a token the API server does not know");
    let (code, body) = curl_metrics(port, Some(&stranger))?;
    assert_eq!(code, 403, "a valid token without the right: {body}");
    assert!(!body.contains("keelson_"), "a refusal leaks series: {body}");
    // Plain HTTP gets nothing.
    assert!(
        testkit::process::http_get(port, "/metrics").await.map_or(true, |(code, _)| code != 200),
        "served over plain HTTP"
    );
    Ok(())
}
