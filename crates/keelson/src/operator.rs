//! `keelson run`: wires the client, HTTP endpoints, leader election and the
//! controllers of [`CONTROLLERS`] together, and shuts them down cleanly on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::runtime::controller::{ControllerDef, RunParams};
use crate::runtime::health::{self, Readiness};
use crate::runtime::leader::LeaderElector;
use crate::runtime::{Context, Metrics, Settings, secure_metrics};
use crate::{mydatabase, webapp};

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "KEELSON_NAMESPACE")]
    pub namespace: Option<String>,

    /// Run only while holding the leader Lease, so several replicas can run safely.
    #[arg(long, env = "KEELSON_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,

    /// Namespace of the leader Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "KEELSON_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader Lease.
    #[arg(long, env = "KEELSON_LEADER_ELECTION_ID", default_value = "keelson-leader")]
    pub leader_election_id: String,

    /// Address of the Prometheus `/metrics` endpoint.
    #[arg(long, env = "KEELSON_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Serve `/metrics` over HTTPS to callers whose bearer token the API server
    /// accepts and allows `get /metrics` (TokenReview, SubjectAccessReview).
    #[arg(long, env = "KEELSON_METRICS_SECURE")]
    pub metrics_secure: bool,

    /// With --metrics-secure: a folder with `tls.crt` and `tls.key` (read again
    /// when they change). Without it, a self-signed certificate made at start.
    #[arg(long, env = "KEELSON_METRICS_CERT_DIR", requires = "metrics_secure")]
    pub metrics_cert_dir: Option<std::path::PathBuf>,

    /// Address of the `/healthz` and `/readyz` endpoints.
    #[arg(long, env = "KEELSON_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,

    /// Reconciles that may run at once per controller (never two for one object).
    #[arg(long, env = "KEELSON_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Log format.
    #[arg(long, env = "KEELSON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (info, debug, ...) or a tracing directive such as `keelson=debug,kube=info`.
    #[arg(long, env = "KEELSON_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// The image MyDatabase pods copy the instance manager from (an init
    /// container). Default: the operator's own image, which holds this
    /// binary (read from its pod in a cluster), else `keelson:<version>`.
    #[arg(long, env = "KEELSON_INSTANCE_IMAGE")]
    pub instance_image: Option<String>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid --log-level {0:?}: {1}")]
    LogLevel(String, String),
    #[error("cannot reach the Kubernetes API (is KUBECONFIG set?): {0}")]
    Client(#[source] kube::Error),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("--metrics-secure: {0}")]
    MetricsTls(#[source] crate::runtime::secure_metrics::SecureMetricsError),
    #[error("lost the leader Lease; exiting so another instance takes over")]
    LostLease,
}

fn init_tracing(args: &RunArgs) -> Result<(), RunError> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| RunError::LogLevel(args.log_level.clone(), e.to_string()))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let result = match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    // A second init (e.g. in tests) keeps the first subscriber.
    drop(result);
    Ok(())
}

/// Resolves when SIGTERM or Ctrl-C arrives.
pub(crate) async fn termination_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The instance manager's image: the one set, else this pod's own (the same
/// binary, whatever `make deploy IMG=…`, Helm or kustomize made it), else the default.
async fn instance_image(client: &kube::Client, set: Option<String>) -> String {
    if let Some(image) = set {
        return image;
    }
    let fallback = Settings::default().instance_image;
    let (Ok(pod), Ok(namespace)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) else {
        return fallback;
    };
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), &namespace);
    // A list by name: the ClusterRole grants list and watch on pods, not get.
    let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={pod}"));
    let own = match pods.list(&by_name).await {
        Ok(list) => list
            .items
            .into_iter()
            .next()
            .and_then(|p| p.spec)
            .and_then(|spec| spec.containers.into_iter().find(|c| c.name == MANAGER_CONTAINER)?.image),
        Err(error) => {
            tracing::warn!(%error, namespace, pod, "cannot read this pod's image; set --instance-image");
            None
        }
    };
    own.unwrap_or(fallback)
}

/// The operator's container in its Deployment: it reads its own image from it (see `instance_image`).
pub const MANAGER_CONTAINER: &str = "manager";

/// Every controller the operator runs; RBAC is generated from the same table.
pub const CONTROLLERS: &[ControllerDef] = &[webapp::CONTROLLER, mydatabase::CONTROLLER];

/// Runs every controller until `shutdown` turns true, draining in-flight
/// reconciles; `readiness` turns ready once every controller's cache synced.
pub async fn run_controllers(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    readiness: Readiness,
    shutdown: watch::Receiver<bool>,
) {
    let synced = Arc::new(AtomicUsize::new(0));
    let runs = CONTROLLERS.iter().map(|controller| {
        let (synced, ready) = (synced.clone(), readiness.clone());
        let on_synced = Box::new(move || {
            if synced.fetch_add(1, Ordering::SeqCst) + 1 == CONTROLLERS.len() {
                tracing::info!("caches synced; ready");
                ready.set_ready();
            }
        });
        (controller.run)(RunParams {
            ctx: ctx.clone(),
            readiness: readiness.clone(),
            namespace: namespace.clone(),
            concurrency,
            on_synced,
            shutdown: shutdown.clone(),
        })
    });
    futures::future::join_all(runs).await;
}

pub async fn run(args: RunArgs) -> Result<(), RunError> {
    init_tracing(&args)?;
    let metrics = Arc::new(Metrics::default());
    let client = crate::runtime::client::build(metrics.clone()).await.map_err(RunError::Client)?;
    let readiness = Readiness::default();
    health::serve(args.health_addr, health::health_router(readiness.clone()))
        .await
        .map_err(|e| RunError::Listen(args.health_addr, e))?;
    let metrics_router = health::metrics_router(metrics.clone());
    match args.metrics_secure {
        true => {
            let tls = secure_metrics::tls_config(args.metrics_cert_dir.as_deref()).map_err(RunError::MetricsTls)?;
            let router = secure_metrics::authorized(metrics_router, secure_metrics::MetricsAuth::new(client.clone()));
            secure_metrics::serve_tls(args.metrics_addr, router, tls).await
        }
        false => health::serve(args.metrics_addr, metrics_router).await,
    }
    .map_err(|e| RunError::Listen(args.metrics_addr, e))?;

    // `stop` flips to true on a termination signal; every task watches it.
    let (stop_tx, mut stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination_signal().await;
        tracing::info!("termination signal received; draining in-flight reconciles");
        let _ = stop_tx.send(true);
    });

    let mut elector = None;
    if args.leader_elect {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_string());
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| format!("keelson-{}", std::process::id()));
        let mut candidate = LeaderElector::new(client.clone(), &namespace, &args.leader_election_id, &identity);
        tracing::info!(lease = %args.leader_election_id, %namespace, %identity, "waiting to become leader");
        tokio::select! {
            _ = candidate.acquire() => {}
            _ = stop_rx.wait_for(|stop| *stop) => return Ok(()),
        }
        tracing::info!(%identity, "became leader");
        elector = Some(candidate);
    }
    metrics.leader.set(1);

    // Controllers stop on a termination signal, or when the lease is lost.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let lost_lease = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let mut stop = stop_rx.clone();
        let lost_lease = lost_lease.clone();
        tokio::spawn(async move {
            let mut elector = elector;
            let holding = async {
                match elector.as_mut() {
                    Some(elector) => elector.hold().await,
                    None => futures::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => {}
                _ = holding => {
                    tracing::error!("lost the leader Lease");
                    lost_lease.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _ = shutdown_tx.send(true);
            elector
        })
    };
    tracing::info!(namespace = ?args.namespace, concurrency = args.concurrency, "starting controllers");
    let webapps = crate::runtime::scoped_api::<crate::api::WebApp>(&client, args.namespace.as_deref());
    let streaming_lists = crate::runtime::cache::streaming_lists_supported(&webapps).await;
    tracing::info!(streaming_lists, "initial lists: streamed if the API server supports it");
    let instance_image = instance_image(&client, args.instance_image.clone()).await;
    tracing::info!(%instance_image, "MyDatabase pods copy the instance manager from this image");
    let settings = Settings { instance_image, streaming_lists };
    let ctx = Context::new(client, metrics.clone(), settings);
    run_controllers(ctx, args.namespace.clone(), args.concurrency, readiness, shutdown_rx).await;
    metrics.leader.set(0);

    if lost_lease.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(RunError::LostLease);
    }
    // Reconciles have drained: give the lease up so a successor starts at once.
    if let Ok(Some(mut elector)) = holder.await {
        match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
            Ok(Ok(())) => tracing::info!("released the leader Lease"),
            Ok(Err(error)) => tracing::warn!(%error, "could not release the leader Lease"),
            Err(_) => tracing::warn!("timed out releasing the leader Lease"),
        }
    }
    tracing::info!("stopped cleanly");
    Ok(())
}
