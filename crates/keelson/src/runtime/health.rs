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

use super::client::{CONNECT_TIMEOUT, RETRY_MAX_DELAY};
use super::metrics::Metrics;

/// A watch may be broken this long (a blip, a reconnect) before the
/// operator stops calling itself ready.
const BROKEN_WATCH_GRACE: Duration = Duration::from_secs(3);

/// A watch that still fails reports it again within this: its retry waits at
/// most twice the backoff's cap, and a connection attempt gives up after the
/// client's connect timeout. One quiet for longer got through: a watch resumed
/// where it stopped sends nothing until an object changes, so "no failure
/// since" is the only sign of it (after an API-server restart, two watches
/// resumed so stayed "failing" for minutes with nothing wrong).
const FAILS_AGAIN_WITHIN: Duration =
    RETRY_MAX_DELAY.saturating_mul(2).saturating_add(CONNECT_TIMEOUT).saturating_add(Duration::from_secs(3));

/// Readiness as the controllers report it: ready once every cache has synced,
/// and not while a watch has been failing for longer than a few seconds
/// (the API server unreachable, a permission gone).
#[derive(Clone, Default)]
pub struct Readiness(Arc<ReadinessState>);

#[derive(Default)]
struct ReadinessState {
    synced: AtomicBool,
    /// Watches failing now, by name.
    broken: Mutex<BTreeMap<String, Failing>>,
}

/// One watch's current run of failures.
#[derive(Clone, Copy)]
struct Failing {
    since: Instant,
    last: Instant,
}

impl Failing {
    fn is_broken(&self) -> bool {
        self.since.elapsed() > BROKEN_WATCH_GRACE && self.last.elapsed() < FAILS_AGAIN_WITHIN
    }
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
            .filter(|(_, failing)| failing.is_broken())
            .map(|(watch, failing)| format!("{watch} ({}s)", failing.since.elapsed().as_secs()))
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
        let now = Instant::now();
        match broken.get_mut(&self.name) {
            Some(failing) if now.duration_since(failing.last) < FAILS_AGAIN_WITHIN => {
                failing.last = now;
                tracing::debug!(watch = %self.name, %error, "watch still failing");
            }
            _ => {
                tracing::warn!(watch = %self.name, %error, "watch failed; retrying");
                broken.insert(self.name.clone(), Failing { since: now, last: now });
            }
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
        let failing_since = |since: Duration, last: Duration| {
            let now = Instant::now();
            let failing = Failing { since: now - since, last: now - last };
            readiness.0.broken.lock().expect("lock").insert("webapp/Deployment".into(), failing);
        };
        failing_since(2 * BROKEN_WATCH_GRACE, Duration::from_secs(1));
        assert!(readiness.problem().is_some_and(|p| p.contains("webapp/Deployment")));
        watch.working();
        assert!(readiness.is_ready());

        // Quiet since its last failure for longer than a retry takes: it got through.
        failing_since(FAILS_AGAIN_WITHIN * 3, FAILS_AGAIN_WITHIN + Duration::from_secs(1));
        assert!(readiness.is_ready(), "a watch resumed without events is not failing");
        // Its next failure starts a new run, tolerated as a blip again.
        watch.failed(&"connection refused");
        assert!(readiness.is_ready());
        let since = readiness.0.broken.lock().expect("lock")["webapp/Deployment"].since;
        assert!(since.elapsed() < BROKEN_WATCH_GRACE, "a new run of failures, not the old one");
    }
}
