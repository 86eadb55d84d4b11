//! The Kubernetes client, with every HTTP request it makes (watches included)
//! counted by method and status code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::{Layer, Service};

use super::metrics::{HttpLabels, Metrics};

pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a failed watch waits before it retries, before jitter (which adds up to as much).
pub const RETRY_MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(2);

/// Builds the client from the ambient configuration (KUBECONFIG or in-cluster).
pub async fn build(metrics: Arc<Metrics>) -> Result<Client, kube::Error> {
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    // A connection to an API server that is shutting down can hang until this
    // runs out; kube's 30 s kept watches away from a restarted server for as long.
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    Ok(ClientBuilder::try_from(config)?.with_layer(&CountRequests(metrics)).build())
}

#[derive(Clone)]
struct CountRequests(Arc<Metrics>);

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, metrics: self.0.clone() }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// The verb a request carries, as the API server's audit log names it (GET
/// of a single object and of a list are both `get` here).
fn verb(request: &Request<Body>) -> &'static str {
    let watch = request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match request.method().as_str() {
        "GET" if watch => "watch",
        "GET" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "other",
    }
}

impl<S, B> Service<Request<Body>> for Counted<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let verb = verb(&request);
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            let code = match &response {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            metrics.http_requests.get_or_create(&HttpLabels { verb, code }).inc();
            response
        })
    }
}
