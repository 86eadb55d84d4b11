//! Harness for integration tests against a real Kubernetes control plane.
//!
//! - [`Cluster::connect`] reaches the cluster `KUBECONFIG` names (the one
//!   `make cluster-up` starts), and fails loudly under `CI=true` if it cannot.
//! - [`TestNamespace`] gives each test its own namespace, deleted on drop,
//!   so tests run in parallel without seeing each other; its pods go to
//!   KWOK's fake nodes ([`Cluster::namespace`]) or to the real node
//!   ([`Cluster::real_namespace`]).
//! - [`pods`] runs a command in a real container and returns what it printed.
//! - [`wait_for`] polls a condition through a watch with a timeout and, on
//!   timeout, prints the object, everything in its namespace and the Events.

pub mod control_plane;
mod diagnostics;
mod http;
mod namespace;
pub mod pods;
pub mod postgres;
pub mod process;
mod wait;

pub use diagnostics::dump_namespace;
pub use http::http_get;
pub use namespace::{Nodes, TestNamespace};
pub use wait::{DEFAULT_TIMEOUT, eventually, wait_for, wait_for_deletion};

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A connection to the test cluster.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    config: Config,
}

impl Cluster {
    /// Connects to the cluster `KUBECONFIG` names and checks it answers.
    ///
    /// Returns `None` (and says so on stderr) when no cluster is configured
    /// outside CI; under `CI=true` a missing cluster is a test failure.
    pub async fn connect() -> Option<Cluster> {
        match Self::try_connect().await {
            Ok(cluster) => Some(cluster),
            Err(error) => {
                let message = format!(
                    "no Kubernetes control plane for integration tests: {error:#}\n\
                     Run `make test` (it starts one), or `make cluster-up && source target/dev-cluster/env`."
                );
                if std::env::var("CI").is_ok_and(|v| v == "true")
                    || std::env::var("KEELSON_REQUIRE_CLUSTER").is_ok_and(|v| v == "1")
                {
                    panic!("{message}");
                }
                eprintln!("SKIPPING integration test: {message}");
                None
            }
        }
    }

    async fn try_connect() -> anyhow::Result<Cluster> {
        let path = std::env::var("KUBECONFIG").context("KUBECONFIG is not set")?;
        let kubeconfig = Kubeconfig::read_from(&path).with_context(|| format!("cannot read kubeconfig {path}"))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .context("invalid kubeconfig")?;
        let client = Client::try_from(config.clone()).context("cannot build a client")?;
        client.apiserver_version().await.context("the API server does not answer")?;
        Ok(Cluster { client, config })
    }

    /// A client that acts as `system:serviceaccount:<namespace>:<name>`
    /// (through impersonation), so RBAC applies to it as to a pod.
    pub fn client_as_service_account(&self, namespace: &str, name: &str) -> anyhow::Result<Client> {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        config.auth_info.impersonate_groups = Some(vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ]);
        Client::try_from(config).context("cannot build an impersonating client")
    }

    /// A client that presents `token` (a ServiceAccount token bound to a pod,
    /// say) and no other credential.
    pub fn client_with_token(&self, token: &str) -> anyhow::Result<Client> {
        let mut config = self.config.clone();
        config.auth_info = kube::config::AuthInfo { token: Some(token.to_string().into()), ..Default::default() };
        Client::try_from(config).context("cannot build a client with a token")
    }

    /// Creates a fresh namespace for one test whose pods go to KWOK's fake
    /// nodes: most tests are about API objects, not about running containers.
    pub async fn namespace(&self, test_name: &str) -> anyhow::Result<TestNamespace> {
        TestNamespace::create(self.client.clone(), self.config.clone(), test_name, Nodes::Fake).await
    }

    /// Creates a fresh namespace for one test whose pods run real containers
    /// on the real node.
    pub async fn real_namespace(&self, test_name: &str) -> anyhow::Result<TestNamespace> {
        TestNamespace::create(self.client.clone(), self.config.clone(), test_name, Nodes::Real).await
    }
}

/// Connects, or returns from the test early when no cluster is configured
/// outside CI (see [`Cluster::connect`]).
#[macro_export]
macro_rules! cluster_or_skip {
    () => {
        match $crate::Cluster::connect().await {
            Some(cluster) => cluster,
            None => return Ok(()),
        }
    };
}

/// Runs the cluster's `kubectl` (first on PATH after sourcing the cluster's
/// `env`) as a user would, returning stdout; stderr becomes the error.
pub fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let program = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let output =
        std::process::Command::new(&program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        anyhow::bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim())
    }
}
