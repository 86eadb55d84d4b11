//! The `/healthz`, `/readyz` and `/metrics` HTTP endpoints.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// A watch may be broken this long (a blip, a reconnect) before the
/// operator stops calling itself ready.
const BROKEN_WATCH_GRACE: Duration = Duration::from_secs(3);

/// Readiness as the controllers report it: ready once every cache has synced,
/// and not while a watch has been failing for longer than a few seconds
/// (the API server unreachable, a permission gone).
#[derive(Clone, Default)]
pub struct Readiness(Arc<ReadinessState>);

#[derive(Default)]
struct ReadinessState {
    synced: AtomicBool,
    /// Watches failing now, and since when.
    broken: Mutex<BTreeMap<String, Instant>>,
}

impl Readiness {
    pub fn set_ready(&self) {
        self.0.synced.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.problem().is_none()
    }

    /// Why the operator is not ready, if it is not.
    pub fn problem(&self) -> Option<String> {
        if !self.0.synced.load(Ordering::SeqCst) {
            return Some("caches not synced yet".into());
        }
        let broken = self.0.broken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let failing: Vec<String> = broken
            .iter()
            .filter(|(_, since)| since.elapsed() > BROKEN_WATCH_GRACE)
            .map(|(watch, since)| format!("{watch} ({}s)", since.elapsed().as_secs()))
            .collect();
        (!failing.is_empty()).then(|| format!("watches failing: {}", failing.join(", ")))
    }

    /// The health of one named watch, for the watch to report on.
    pub fn watch(&self, name: impl Into<String>) -> WatchHealth {
        WatchHealth { readiness: self.clone(), name: name.into(), failing: Arc::default() }
    }
}

/// One watch's reports to [`Readiness`].
#[derive(Clone)]
pub struct WatchHealth {
    readiness: Readiness,
    name: String,
    /// Whether this watch is in the shared map, so the hot path (every watch
    /// event) takes no lock while all is well.
    failing: Arc<AtomicBool>,
}

impl WatchHealth {
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        self.failing.store(true, Ordering::SeqCst);
        let mut broken = self.readiness.0.broken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if broken.contains_key(&self.name) {
            tracing::debug!(watch = %self.name, %error, "watch still failing");
        } else {
            tracing::warn!(watch = %self.name, %error, "watch failed; retrying");
            broken.insert(self.name.clone(), Instant::now());
        }
    }

    pub fn working(&self) {
        if !self.failing.swap(false, Ordering::SeqCst) {
            return;
        }
        let mut broken = self.readiness.0.broken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if broken.remove(&self.name).is_some() {
            tracing::info!(watch = %self.name, "watch recovered");
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    match readiness.problem() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
    }
}

async fn render_metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render())
}

pub fn health_router(readiness: Readiness) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(readiness)
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(render_metrics)).with_state(metrics)
}

/// Binds `addr` and serves `router` until the process ends.
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving HTTP");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "HTTP server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_after_sync_and_not_while_a_watch_fails() {
        let readiness = Readiness::default();
        assert_eq!(readiness.problem().as_deref(), Some("caches not synced yet"));
        readiness.set_ready();
        assert!(readiness.is_ready());
        let watch = readiness.watch("webapp/Deployment");
        watch.failed(&"connection refused");
        assert!(readiness.is_ready(), "a blip is tolerated");
        readiness
            .0
            .broken
            .lock()
            .expect("lock")
            .insert("webapp/Deployment".into(), Instant::now() - 2 * BROKEN_WATCH_GRACE);
        assert!(readiness.problem().is_some_and(|p| p.contains("webapp/Deployment")));
        watch.working();
        assert!(readiness.is_ready());
    }
}
