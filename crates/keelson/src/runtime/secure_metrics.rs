//! `/metrics` over HTTPS for callers the API server vouches for, as
//! kubebuilder's `--metrics-secure` does: the bearer token is checked with a
//! TokenReview, and its user must be allowed `get` on the non-resource URL
//! `/metrics` (a SubjectAccessReview; the `keelson-metrics-reader`
//! ClusterRole grants it). The certificate is `tls.crt`/`tls.key` from a
//! folder (cert-manager's Secret, mounted; read again when it changes) or,
//! without one, a self-signed one made at start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

/// How long a verdict on a token is kept: a scrape every 30 s costs two API calls a minute at most.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const DENIED_FOR: Duration = Duration::from_secs(10);
/// Verdicts kept at most (tokens are few: one per scraper).
const VERDICTS_KEPT: usize = 256;
/// A longer bearer token is refused unread (a service account's is about 1 KB).
const TOKEN_MAX: usize = 8 << 10;
/// Reviews in flight at most: a caller sending made-up tokens costs the API
/// server (and this operator's share of it) no more than this.
const REVIEWS_AT_ONCE: usize = 2;
/// A TLS handshake, or a request's headers, that take longer are dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait to be accepted.
const CONNECTIONS_AT_ONCE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum SecureMetricsError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} holds no usable PEM {what}")]
    Pem { path: String, what: &'static str },
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(#[source] rcgen::Error),
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
}

/// Who may read `/metrics`: the API server's answers, kept a short while.
#[derive(Clone)]
pub struct MetricsAuth {
    client: Client,
    verdicts: Arc<Mutex<HashMap<String, (Instant, Verdict)>>>,
    reviews: Arc<tokio::sync::Semaphore>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Unauthenticated,
    Forbidden,
    /// Too many reviews in flight: asked again later.
    Busy,
}

fn kept_for(verdict: Verdict) -> Duration {
    if verdict == Verdict::Allowed { ALLOWED_FOR } else { DENIED_FOR }
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            verdicts: Arc::default(),
            reviews: Arc::new(tokio::sync::Semaphore::new(REVIEWS_AT_ONCE)),
        }
    }

    async fn verdict(&self, token: &str) -> Verdict {
        let now = Instant::now();
        {
            let verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, verdict)) = verdicts.get(token)
                && now.duration_since(*at) < kept_for(*verdict)
            {
                return *verdict;
            }
        }
        let Ok(_permit) = self.reviews.try_acquire() else { return Verdict::Busy };
        let verdict = self.ask(token).await;
        let mut verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if verdicts.len() >= VERDICTS_KEPT {
            // The expired go; a full table of live ones keeps them (a scraper's is among them).
            verdicts.retain(|_, (at, verdict)| now.duration_since(*at) < kept_for(*verdict));
        }
        if verdicts.len() < VERDICTS_KEPT {
            verdicts.insert(token.to_string(), (now, verdict));
        }
        verdict
    }

    /// A TokenReview, then a SubjectAccessReview for `get /metrics`. An API
    /// error denies (and is logged): nothing is served on a guess.
    async fn ask(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), ..Default::default() },
            ..Default::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await
        {
            Ok(reviewed) => reviewed,
            Err(error) => {
                tracing::warn!(%error, "metrics: cannot review a token; denying");
                return Verdict::Unauthenticated;
            }
        };
        let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
            return Verdict::Unauthenticated;
        };
        let user = status.user.unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &access).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
            Ok(_) => {
                tracing::info!(
                    user = user.username.as_deref().unwrap_or_default(),
                    "metrics: not allowed get /metrics"
                );
                Verdict::Forbidden
            }
            Err(error) => {
                tracing::warn!(%error, "metrics: cannot review access; denying");
                Verdict::Forbidden
            }
        }
    }
}

async fn authorize(State(auth): State<MetricsAuth>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .map(str::to_string);
    let Some(token) = token else {
        return (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response();
    };
    if token.len() > TOKEN_MAX {
        return (StatusCode::UNAUTHORIZED, "the token is not valid\n").into_response();
    }
    match auth.verdict(&token).await {
        Verdict::Allowed => next.run(request).await,
        Verdict::Unauthenticated => (StatusCode::UNAUTHORIZED, "the token is not valid\n").into_response(),
        Verdict::Forbidden => (StatusCode::FORBIDDEN, "not allowed: get /metrics\n").into_response(),
        Verdict::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy reviewing tokens; try again\n").into_response(),
    }
}

/// `router` behind the bearer-token check.
pub fn authorized(router: Router, auth: MetricsAuth) -> Router {
    router.layer(middleware::from_fn_with_state(auth, authorize))
}

/// The certificate to serve: from `dir` (read again whenever `tls.crt` changes), or self-signed.
#[derive(Debug)]
struct Certificates {
    dir: Option<PathBuf>,
    current: Mutex<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl Certificates {
    fn load(dir: &Path) -> Result<(Option<SystemTime>, Arc<CertifiedKey>), SecureMetricsError> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| SecureMetricsError::Read { path: path.display().to_string(), source })
        };
        let modified = std::fs::metadata(dir.join("tls.crt")).and_then(|m| m.modified()).ok();
        let pem = |what| SecureMetricsError::Pem { path: dir.display().to_string(), what };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read("tls.crt")?)
            .collect::<Result<_, _>>()
            .map_err(|_| pem("certificate"))?;
        if chain.is_empty() {
            return Err(pem("certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(&read("tls.key")?).map_err(|_| pem("private key"))?;
        Ok((modified, Arc::new(certified(chain, key)?)))
    }

    fn self_signed() -> Result<Arc<CertifiedKey>, SecureMetricsError> {
        let made = rcgen::generate_simple_self_signed(vec!["keelson-metrics".to_string(), "localhost".to_string()])
            .map_err(SecureMetricsError::SelfSigned)?;
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
            .map_err(|_| SecureMetricsError::Pem { path: "self-signed".into(), what: "private key" })?;
        Ok(Arc::new(certified(vec![made.cert.der().clone()], key)?))
    }
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, SecureMetricsError> {
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider).map_err(SecureMetricsError::Tls)
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = &self.dir {
            let modified = std::fs::metadata(dir.join("tls.crt")).and_then(|m| m.modified()).ok();
            if modified != current.0 {
                match Certificates::load(dir) {
                    Ok(loaded) => {
                        tracing::info!(dir = %dir.display(), "metrics: serving the renewed certificate");
                        *current = loaded;
                    }
                    // Half-written (a renewal in progress): the previous one until it is whole.
                    Err(error) => tracing::warn!(%error, "metrics: keeping the previous certificate"),
                }
            }
        }
        Some(current.1.clone())
    }
}

/// The TLS settings for `/metrics`: the certificate in `cert_dir`, else a self-signed one.
pub fn tls_config(cert_dir: Option<&Path>) -> Result<Arc<ServerConfig>, SecureMetricsError> {
    let current = match cert_dir {
        Some(dir) => Certificates::load(dir)?,
        None => (None, Certificates::self_signed()?),
    };
    let resolver = Certificates { dir: cert_dir.map(Path::to_path_buf), current: Mutex::new(current) };
    let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(SecureMetricsError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    Ok(Arc::new(config))
}

/// Binds `addr` and serves `router` over TLS until the process ends.
pub async fn serve_tls(
    addr: SocketAddr,
    router: Router,
    config: Arc<ServerConfig>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    let acceptor = TlsAcceptor::from(config);
    tracing::info!(%addr, "serving HTTPS");
    let connections = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_AT_ONCE));
    Ok(tokio::spawn(async move {
        loop {
            let Ok(connection) = connections.clone().acquire_owned().await else { return };
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: not a reason to spin.
                    tracing::warn!(%error, "metrics: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let _connection = connection;
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => return tracing::debug!(%peer, %error, "metrics: TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "metrics: TLS handshake timed out"),
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HANDSHAKE_TIMEOUT)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
                if let Err(error) = connection.await {
                    tracing::debug!(%peer, %error, "metrics: connection ended with an error");
                }
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_folder_is_read_and_a_broken_one_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("keelson-metrics-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let made = rcgen::generate_simple_self_signed(vec!["metrics.example".to_string()]).expect("cert");
        std::fs::write(dir.join("tls.crt"), made.cert.pem()).expect("write");
        std::fs::write(dir.join("tls.key"), made.signing_key.serialize_pem()).expect("write");
        assert!(tls_config(Some(&dir)).is_ok());
        std::fs::write(dir.join("tls.key"), "not a key").expect("write");
        let error = tls_config(Some(&dir)).expect_err("a broken key");
        assert!(error.to_string().contains("no usable PEM private key"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(tls_config(None).is_ok(), "self-signed without a folder");
    }
}
