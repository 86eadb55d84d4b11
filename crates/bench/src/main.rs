//! `make bench`: how fast an operator converges, how quickly it undoes drift,
//! how many writes it makes at rest, and how much it costs — measured on the
//! local control plane against the lower bound of doing the same work directly.

mod measure;
mod report;
mod revert;
mod scale;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use keelson::api::mydatabase::{BackupSpec, DatabasePhase, DeletionPolicy, MyDatabase, MyDatabaseSpec};
use keelson::api::webapp::{ServiceType, WebApp, WebAppPhase, WebAppSpec};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use rand::Rng;
use serde_json::json;
use tokio::sync::Mutex;

use measure::{CpuAccount, ProcessSampler, Summary, round};

#[derive(Parser, Debug)]
#[command(about = "Benchmark an operator on the local control plane")]
struct Args {
    /// WebApps (replicas 1) created at once.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    /// Drift trials (scale a random owned Deployment to 10).
    #[arg(long, default_value_t = 100)]
    drift_trials: usize,
    /// Reverts written each way (whole-object apply, one-field merge patch) in the comparison of the two.
    #[arg(long, default_value_t = 50)]
    revert_trials: usize,
    /// MyDatabases (replicas 1) created at once.
    #[arg(long, default_value_t = 100)]
    databases: usize,
    /// Seconds of rest in which writes are counted.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// The operator to measure (or BENCH_OPERATOR_CMD); {metrics} and {health} become free loopback ports.
    #[arg(
        long,
        env = "BENCH_OPERATOR_CMD",
        default_value = "target/release/keelson run --metrics-addr 127.0.0.1:{metrics} --health-addr 127.0.0.1:{health} --log-level warn"
    )]
    operator_cmd: String,
    /// The local cluster's directory, where its processes' pids are (CPU by component is read from them).
    #[arg(long, env = "KEELSON_CLUSTER_DIR")]
    cluster_dir: Option<PathBuf>,
    /// The API server's audit log (write requests are counted there).
    #[arg(long, env = "KEELSON_AUDIT_LOG")]
    audit_log: PathBuf,
    /// Where results.json and the pictures go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Also write docs/benchmarks.md and its pictures.
    #[arg(long)]
    write_docs: bool,
    /// Only write docs/benchmarks.md again from this results.json (after its text changed).
    #[arg(long)]
    markdown_from: Option<PathBuf>,
    /// Only summarise the runs in `<dir>/<N>/results.json` into docs/bench-scale.md and docs/bench/scale/.
    #[arg(long)]
    scale_report: Option<PathBuf>,
    /// With --scale-report: why the series stopped before its largest N.
    #[arg(long)]
    stopped: Option<String>,
    /// Skip the lower bound (the same children created directly): no ratio. At N=10,000 that
    /// run alone takes about 25 minutes on 2 cores, and memory, writes and restart do not need it.
    #[arg(long)]
    no_direct: bool,
}

const SA_NAMESPACE: &str = "keelson-bench";
const SA: &str = "keelson";
const APPS_NS: &str = "bench-webapps";
const DIRECT_NS: &str = "bench-direct";
const DB_NS: &str = "bench-databases";
const REVERT_NS: &str = "bench-revert";
/// How long the API server must have written nothing before a drift trial starts.
const DRIFT_QUIET: Duration = Duration::from_millis(500);

fn webapp(i: usize) -> WebApp {
    WebApp::new(
        &format!("app-{i:04}"),
        WebAppSpec {
            replicas: 1,
            image: "nginx:1.25-alpine".into(),
            port: 80,
            service_type: ServiceType::NodePort,
            ..Default::default()
        },
    )
}

async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Some(existing) = namespaces.get_opt(name).await? {
        if existing.metadata.deletion_timestamp.is_some() {
            wait_gone(client, name).await?;
        } else {
            return Ok(());
        }
    }
    let ns = Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() };
    namespaces.create(&PostParams::default(), &ns).await?;
    Ok(())
}

async fn wait_gone(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    while namespaces.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            bail!("namespace {name} did not go away");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn delete_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await?.is_some() {
        namespaces.delete(name, &DeleteParams::background()).await?;
    }
    wait_gone(client, name).await
}

/// CRDs, and the operator's ServiceAccount bound cluster-wide to the generated ClusterRole.
async fn install(client: &Client) -> anyhow::Result<()> {
    let params = PatchParams::apply("keelson-bench").force();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in keelson::manifests::crd::all() {
        crds.patch(&crd.name_any(), &params, &Patch::Apply(&crd)).await?;
    }
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let role = keelson::manifests::rbac::cluster_role();
    roles.patch(&role.name_any(), &params, &Patch::Apply(&role)).await?;
    ensure_namespace(client, SA_NAMESPACE).await?;
    let sa =
        ServiceAccount { metadata: ObjectMeta { name: Some(SA.into()), ..Default::default() }, ..Default::default() };
    Api::<ServiceAccount>::namespaced(client.clone(), SA_NAMESPACE).patch(SA, &params, &Patch::Apply(&sa)).await?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some("keelson-bench".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.name_any(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: SA.into(),
            namespace: Some(SA_NAMESPACE.into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone()).patch("keelson-bench", &params, &Patch::Apply(&binding)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

/// Creates `count` objects with bounded parallelism, as a burst of users would.
async fn create_all<K, F>(api: &Api<K>, count: usize, build: F) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    F: Fn(usize) -> K,
{
    let objects: Vec<K> = (0..count).map(build).collect();
    stream::iter(objects.into_iter().map(|o| async move { api.create(&PostParams::default(), &o).await.map(|_| ()) }))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Watches `api` until `done` holds for `count` objects; returns the elapsed
/// time at which each one first satisfied it.
async fn converge<K, F>(
    api: Api<K>,
    count: usize,
    start: Instant,
    timeout: Duration,
    done: F,
) -> anyhow::Result<Vec<f64>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&K) -> bool,
{
    let mut seen: BTreeMap<String, f64> = BTreeMap::new();
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + timeout;
    while seen.len() < count {
        let next = tokio::time::timeout_at(deadline, stream.next()).await.context("convergence timed out")?;
        match next {
            Some(Ok(object)) if done(&object) => {
                seen.entry(object.name_any()).or_insert_with(|| start.elapsed().as_secs_f64());
            }
            Some(_) => {}
            None => bail!("watch ended"),
        }
    }
    let mut times: Vec<f64> = seen.into_values().collect();
    times.sort_by(f64::total_cmp);
    Ok(times)
}

fn deployment_available(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    d.status
        .as_ref()
        .is_some_and(|s| s.available_replicas == Some(want) && s.observed_generation >= d.metadata.generation)
}

/// Lower bound: the same Deployments and Services created directly.
async fn direct(client: &Client, n: usize) -> anyhow::Result<(f64, Vec<f64>)> {
    ensure_namespace(client, DIRECT_NS).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), DIRECT_NS);
    let services: Api<Service> = Api::namespaced(client.clone(), DIRECT_NS);
    let children = |i: usize| -> anyhow::Result<(Deployment, Service)> {
        let mut app = webapp(i);
        app.metadata.namespace = Some(DIRECT_NS.into());
        app.metadata.uid = Some("00000000-0000-4000-8000-000000000000".into());
        let mut deployment = keelson::webapp::deployment::build(&app)?;
        let mut service = keelson::webapp::service::build(&app)?;
        deployment.metadata.owner_references = None;
        service.metadata.owner_references = None;
        Ok((deployment, service))
    };
    let pairs: Vec<(Deployment, Service)> = (0..n).map(children).collect::<anyhow::Result<_>>()?;
    let start = Instant::now();
    let watch = tokio::spawn(converge(deployments.clone(), n, start, convergence_timeout(n), deployment_available));
    stream::iter(pairs.into_iter().map(|(d, s)| {
        let (deployments, services) = (deployments.clone(), services.clone());
        async move {
            deployments.create(&PostParams::default(), &d).await?;
            services.create(&PostParams::default(), &s).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    let times = watch.await??;
    Ok((start.elapsed().as_secs_f64(), times))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.scale_report {
        let runs = scale::collect(dir)?;
        scale::write_pictures(std::path::Path::new("docs/bench/scale"), &runs)?;
        std::fs::write("docs/bench-scale.md", scale::markdown(&runs, args.stopped.as_deref()))?;
        return Ok(());
    }
    if let Some(results) = &args.markdown_from {
        let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(results)?)?;
        std::fs::write("docs/benchmarks.md", report::markdown(&results))?;
        return Ok(());
    }
    let cluster = testkit::Cluster::connect().await.context("no cluster: run through `make bench`")?;
    let client = cluster.client.clone();
    std::fs::create_dir_all(&args.out)?;
    let version = client.apiserver_version().await?.git_version;
    eprintln!(
        "[bench] Kubernetes {version}; N={} webapps, {} drift trials, {} databases",
        args.n, args.drift_trials, args.databases
    );
    install(&client).await?;
    for ns in [APPS_NS, DIRECT_NS, DB_NS, REVERT_NS] {
        delete_namespace(&client, ns).await?;
    }

    // 1. Lower bound, on an otherwise empty cluster.
    let (direct_s, direct_curve, direct_cpu, direct_window) = if args.no_direct {
        eprintln!("[bench] direct: skipped (--no-direct)");
        (None, Vec::new(), None, None)
    } else {
        eprintln!("[bench] direct: {} Deployments + Services without an operator", args.n);
        let account = args.cluster_dir.as_deref().map(|dir| CpuAccount::start(dir, None));
        let from = chrono::Utc::now();
        let (direct_s, direct_curve) = direct(&client, args.n).await?;
        let window = (from, chrono::Utc::now());
        let direct_cpu = account.map(|account| account.so_far());
        eprintln!("[bench] direct: all available after {direct_s:.1}s; CPU {}", direct_cpu.clone().unwrap_or_default());
        delete_namespace(&client, DIRECT_NS).await?;
        (Some(direct_s), direct_curve, direct_cpu, Some(window))
    };
    let ratio = |convergence_s: f64| direct_s.map(|direct_s| convergence_s / direct_s);

    // 2. The operator, as a subprocess acting as its ServiceAccount.
    ensure_namespace(&client, APPS_NS).await?;
    ensure_namespace(&client, DB_NS).await?;
    let kubeconfig = testkit::process::service_account_kubeconfig(SA_NAMESPACE, SA, &args.out)?;
    let mut operator = measure::Operator::start(&args.operator_cmd, &kubeconfig, &args.out.join("operator.log"))?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let sampler = ProcessSampler::start(operator.pid());

    let apps: Api<WebApp> = Api::namespaced(client.clone(), APPS_NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), APPS_NS);
    let services: Api<Service> = Api::namespaced(client.clone(), APPS_NS);
    let cpu_before = sampler.cpu_seconds();
    let account = args.cluster_dir.as_deref().map(|dir| CpuAccount::start(dir, Some(operator.pid())));
    let start = Instant::now();
    let converging_since = chrono::Utc::now();
    let running = tokio::spawn(converge(apps.clone(), args.n, start, convergence_timeout(args.n), |a: &WebApp| {
        a.status
            .as_ref()
            .is_some_and(|s| s.phase == Some(WebAppPhase::Running) && s.available_replicas == a.spec.replicas)
    }));
    let deployed =
        tokio::spawn(converge(deployments.clone(), args.n, start, convergence_timeout(args.n), |_: &Deployment| true));
    let serviced =
        tokio::spawn(converge(services.clone(), args.n, start, convergence_timeout(args.n), |_: &Service| true));
    create_all(&apps, args.n, webapp).await?;
    let created_s = start.elapsed().as_secs_f64();
    eprintln!("[bench] operator: {} WebApps created in {created_s:.1}s", args.n);
    let running_curve = running.await??;
    let convergence_s = start.elapsed().as_secs_f64();
    let converged_at = chrono::Utc::now();
    let children_s =
        deployed.await??.last().copied().unwrap_or(0.0).max(serviced.await??.last().copied().unwrap_or(0.0));
    let cpu_s = sampler.cpu_seconds() - cpu_before;
    let operator_cpu = account.map(|account| account.so_far());
    let rss_peak_mb = sampler.peak_rss_mb();
    eprintln!(
        "[bench] operator: {} WebApps Running after {convergence_s:.1}s (children after {children_s:.1}s); ratio {}",
        args.n,
        ratio(convergence_s).map_or("not measured (--no-direct)".into(), |r| format!("{r:.2}"))
    );

    // 3. Rest: writes counted by the API server's audit log.
    operator.wait_idle(Duration::from_secs(120)).await?;
    let window_start = chrono::Utc::now();
    // Convergence's writes: from the first WebApp's creation until the operator went idle.
    let user = format!("system:serviceaccount:{SA_NAMESPACE}:{SA}");
    let convergence_writes = measure::audited_writes_by_kind(&args.audit_log, &user, converging_since, window_start)?;
    let convergence_total: u64 = convergence_writes.values().sum();
    // What the rest of the cluster wrote in each run's namespace while its clock ran.
    let cluster_writes =
        |namespace: &str, (from, to)| measure::audited_writes_by_component(&args.audit_log, namespace, &user, from, to);
    let cluster_writes_direct = direct_window.map(|window| cluster_writes(DIRECT_NS, window)).transpose()?;
    let cluster_writes_operator = cluster_writes(APPS_NS, (converging_since, converged_at))?;
    eprintln!(
        "[bench] convergence: {convergence_total} writes ({:.2} per WebApp): {convergence_writes:?}",
        convergence_total as f64 / args.n as f64
    );
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let window_end = chrono::Utc::now();
    let idle_writes = measure::audited_writes(
        &args.audit_log,
        &format!("system:serviceaccount:{SA_NAMESPACE}:{SA}"),
        window_start,
        window_end,
    )?;
    let rss_rest_mb = sampler.current_rss_mb();
    let (rss_rest_anon_mb, rss_rest_file_mb) = sampler.current_rss_split_mb();
    eprintln!(
        "[bench] rest: {idle_writes} writes in {}s; RSS {rss_rest_mb:.1} MB (anonymous {rss_rest_anon_mb:.1}, file {rss_rest_file_mb:.1})",
        args.idle_seconds
    );

    // 4. Drift: scale a random owned Deployment to 10, time the revert through a watch.
    // Every spec.replicas the watch delivers, per Deployment, with when it arrived.
    let seen: Arc<Mutex<ReplicaHistory>> = Arc::default();
    let watch_seen = seen.clone();
    let watch_api = deployments.clone();
    let drift_watch = tokio::spawn(async move {
        let stream = watcher(watch_api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(d)) = stream.next().await {
            let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(-1);
            watch_seen.lock().await.entry(d.name_any()).or_default().push((replicas, Instant::now()));
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics_before_drift = operator.metrics_text().await;
    let drift_from = chrono::Utc::now();
    let mut drift_ms = Vec::new();
    let mut started_quiet = 0;
    for _ in 0..args.drift_trials {
        // A drift comes to a cluster at rest, not into the previous trial's pod churn
        // (its Events, endpoint and status updates trail the revert by up to a second).
        if measure::wait_quiet(&args.audit_log, DRIFT_QUIET, Duration::from_secs(10)).await? {
            started_quiet += 1;
        }
        let name = format!("app-{:04}", rand::rng().random_range(0..args.n));
        let sent = Instant::now();
        deployments.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 10}}))).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The revert is the first replicas=1 after the watch delivered our replicas=10.
            let reverted = seen.lock().await.get(&name).and_then(|events| {
                let after: Vec<&(i32, Instant)> = events.iter().filter(|(_, at)| *at > sent).collect();
                let scaled = after.iter().position(|(r, _)| *r == 10)?;
                after[scaled..].iter().find(|(r, _)| *r == 1).map(|(_, at)| *at)
            });
            if let Some(at) = reverted {
                let ms = at.duration_since(sent).as_secs_f64() * 1000.0;
                drift_ms.push(ms);
                if std::env::var("KEELSON_BENCH_TRACE").is_ok() {
                    eprintln!("[bench] {name} reverted after {ms:.1} ms");
                }
                settle(&deployments, APPS_NS, &name).await?;
                break;
            }
            if Instant::now() > deadline {
                bail!("drift on {name} was not reverted within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    drift_watch.abort();
    let drift = Summary::of(&drift_ms);
    eprintln!(
        "[bench] drift: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({started_quiet} of {} trials started on a quiet API server)",
        drift.p50, drift.p90, drift.p99, drift.max, args.drift_trials
    );
    // Where a revert's time goes, as the API server saw it.
    let reverts = measure::revert_timings(&args.audit_log, &user, drift_from, chrono::Utc::now())?;
    let (outsider_write, reaction, revert_write) =
        (Summary::of(&reverts.outsider_writes), Summary::of(&reverts.reactions), Summary::of(&reverts.writes));
    let revert_span = Summary::of(&reverts.spans());
    eprintln!(
        "[bench] reverts in the audit log ({}): the outsider's write p50 {:.1} / p99 {:.1} ms, reaction p50 {:.1} / p99 {:.1} ms, the revert's write p50 {:.1} / p99 {:.1} ms",
        reverts.reactions.len(),
        outsider_write.p50,
        outsider_write.p99,
        reaction.p50,
        reaction.p99,
        revert_write.p50,
        revert_write.p99
    );
    // And inside the operator, if it says: from the drifted copy's arrival to the revert sent.
    let in_operator = match (metrics_before_drift, operator.metrics_text().await) {
        (Some(before), Some(after)) => {
            let delay = measure::HistogramDelta::between(
                &before,
                &after,
                "keelson_drift_revert_delay_seconds",
                "kind=\"Deployment\"",
            );
            let ms = |seconds: Option<f64>| seconds.filter(|s| s.is_finite()).map(|s| round(s * 1000.0));
            eprintln!("[bench] inside the operator: {delay:?}");
            (delay.count > 0.0).then(|| {
                json!({
                    "count": delay.count,
                    "mean_ms": ms(delay.mean()),
                    "p50_at_most_ms": ms(delay.quantile_at_most(0.5)),
                    "p99_at_most_ms": ms(delay.quantile_at_most(0.99)),
                })
            })
        }
        _ => None,
    };

    // The cheapest correct write for a revert: the two candidates, side by side.
    let revert_writes = if args.revert_trials > 0 {
        ensure_namespace(&client, REVERT_NS).await?;
        let compared = revert::compare(&client, REVERT_NS, args.revert_trials, &args.audit_log).await?;
        eprintln!(
            "[bench] revert writes compared ({} each): apply p50 {:.1} / p99 {:.1} ms, merge patch p50 {:.1} / p99 {:.1} ms; managers after a merge patch: {:?}",
            compared.trials_each,
            compared.apply_ms.p50,
            compared.apply_ms.p99,
            compared.merge_patch_ms.p50,
            compared.merge_patch_ms.p99,
            compared.managers_after_merge_patch
        );
        let _ = Api::<Namespace>::all(client.clone()).delete(REVERT_NS, &DeleteParams::background()).await;
        Some(compared.to_json())
    } else {
        None
    };

    // 5. Restart over the converged WebApps: how soon the new process is ready, and what it writes.
    let (sampler, restart) = {
        let stopped = operator.stop().await?;
        eprintln!("[bench] restart: the operator stopped ({stopped})");
        let restarted_at = chrono::Utc::now();
        let start = Instant::now();
        operator = measure::Operator::start(&args.operator_cmd, &kubeconfig, &args.out.join("operator-restarted.log"))?;
        let sampler = ProcessSampler::start(operator.pid());
        operator.wait_ready(Duration::from_secs(120)).await?;
        let ready_s = start.elapsed().as_secs_f64();
        operator.wait_idle(Duration::from_secs(300)).await?;
        let idle_s = start.elapsed().as_secs_f64();
        let writes = measure::audited_writes_by_kind(&args.audit_log, &user, restarted_at, chrono::Utc::now())?;
        let total: u64 = writes.values().sum();
        let rss_peak_mb = sampler.peak_rss_mb();
        eprintln!(
            "[bench] restart: ready after {ready_s:.1}s, idle after {idle_s:.1}s, {total} writes {writes:?}, peak RSS {rss_peak_mb:.1} MB"
        );
        let restart = json!({
            "ready_s": round(ready_s),
            "idle_s": round(idle_s),
            "writes": total,
            "writes_by_kind": writes,
            "rss_peak_mb": round(rss_peak_mb),
        });
        (sampler, restart)
    };

    // 6. MyDatabase.
    let dbs: Api<MyDatabase> = Api::namespaced(client.clone(), DB_NS);
    let db_start = Instant::now();
    let db_running =
        tokio::spawn(converge(dbs.clone(), args.databases, db_start, Duration::from_secs(1200), |db: &MyDatabase| {
            db.status.as_ref().is_some_and(|s| s.phase == Some(DatabasePhase::Running))
        }));
    create_all(&dbs, args.databases, database).await?;
    db_running.await??;
    let db_convergence_s = db_start.elapsed().as_secs_f64();
    let db_rss_mb = sampler.current_rss_mb();
    eprintln!("[bench] {} MyDatabases Running after {db_convergence_s:.1}s; RSS {db_rss_mb:.1} MB", args.databases);

    let operator_exit = operator.stop().await;
    let results = json!({
        "machine": measure::machine(),
        "kubernetes": version,
        "operator_cmd": args.operator_cmd,
        // The program the command starts (its first word), in MB: its pages are part of the RSS.
        "operator_binary_mb": args.operator_cmd.split_whitespace().next()
            .and_then(|program| std::fs::metadata(program).ok())
            .map(|m| (m.len() as f64 / 1e5).round() / 10.0),
        "webapp": {
            "n": args.n,
            "convergence_s": round(convergence_s),
            "children_s": round(children_s),
            "create_s": round(created_s),
            "direct_s": direct_s.map(round),
            "ratio": ratio(convergence_s).map(round),
            "convergence_writes": convergence_total,
            "convergence_writes_per_webapp": round(convergence_total as f64 / args.n as f64),
            "convergence_writes_by_kind": convergence_writes,
            "drift_trials": args.drift_trials,
            "drift_started_quiet": started_quiet,
            "drift_quiet_ms": DRIFT_QUIET.as_millis(),
            "drift_ms": {"p50": round(drift.p50), "p90": round(drift.p90), "p99": round(drift.p99), "max": round(drift.max)},
            "reverts_audited": reverts.reactions.len(),
            "outsider_write_ms": {"p50": round(outsider_write.p50), "p99": round(outsider_write.p99)},
            "reaction_ms": {"p50": round(reaction.p50), "p99": round(reaction.p99)},
            "reaction_in_operator": in_operator,
            "revert_write_ms": {"p50": round(revert_write.p50), "p99": round(revert_write.p99)},
            "revert_span_ms": {"p50": round(revert_span.p50), "p99": round(revert_span.p99), "max": round(revert_span.max)},
            "revert_writes_compared": revert_writes,
            "idle_seconds": args.idle_seconds,
            "idle_writes": idle_writes,
            "rss_peak_mb": round(rss_peak_mb),
            "rss_rest_mb": round(rss_rest_mb),
            "rss_rest_anon_mb": round(rss_rest_anon_mb),
            "rss_rest_file_mb": round(rss_rest_file_mb),
            "cpu_s": round(cpu_s),
            "cpu_by_process": {"direct": direct_cpu, "operator": operator_cpu},
            "cluster_writes_while_converging": {"direct": cluster_writes_direct, "operator": cluster_writes_operator},
        },
        "restart": restart,
        "mydatabase": {"n": args.databases, "convergence_s": round(db_convergence_s), "rss_mb": round(db_rss_mb)},
        "operator_exit": operator_exit.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
    });
    std::fs::write(args.out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    let curves = report::Curves { operator: running_curve, direct: direct_curve, drift_ms };
    report::write_pictures(&args.out, &curves)?;
    if args.write_docs {
        std::fs::create_dir_all("docs/bench")?;
        report::write_pictures(std::path::Path::new("docs/bench"), &curves)?;
        std::fs::write("docs/benchmarks.md", report::markdown(&results))?;
    }
    println!("{}", serde_json::to_string_pretty(&results)?);
    for ns in [APPS_NS, DB_NS] {
        let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::background()).await;
    }
    Ok(())
}

/// Waits until a Deployment has scaled back down, so the next drift trial
/// measures the operator rather than the previous trial's pod churn.
async fn settle(deployments: &Api<Deployment>, namespace: &str, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = deployments.get(name).await?;
        let status = d.status.clone().unwrap_or_default();
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(deployments.clone().into_client(), namespace);
        let left =
            pods.list_metadata(&kube::api::ListParams::default().labels(&format!("app={name}"))).await?.items.len();
        if status.replicas == Some(1) && deployment_available(&d) && left == 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} did not settle after a drift trial");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn database(i: usize) -> MyDatabase {
    MyDatabase::new(
        &format!("db-{i:03}"),
        MyDatabaseSpec {
            replicas: 1,
            version: "15.2".into(),
            storage: "1Gi".into(),
            image_repository: "postgres".into(),
            backup: Some(BackupSpec {
                schedule: "0 2 * * *".into(),
                retention: "7d".into(),
                storage: "1Gi".into(),
                storage_class_name: None,
            }),
            restore_from: None,
            restore_to: Vec::new(),
            deletion_policy: DeletionPolicy::Delete,
            replication: Default::default(),
            superuser_access: false,
            tls: None,
            ..Default::default()
        },
    )
}

/// spec.replicas values the drift watch saw, per Deployment, with arrival times.
type ReplicaHistory = BTreeMap<String, Vec<(i32, Instant)>>;

/// How long N objects may take to converge: 20 minutes, or 0.3 s each (N=10,000 took 20.4
/// minutes on 2 cores).
fn convergence_timeout(n: usize) -> Duration {
    Duration::from_secs(1200).max(Duration::from_millis(300 * n as u64))
}
