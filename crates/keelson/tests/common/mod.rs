//! Runs the real controllers in-process for one test namespace, as a
//! ServiceAccount bound to the generated ClusterRole (never as admin).

#![allow(dead_code)]

pub mod clients;
pub mod faults;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use keelson::manifests;
use keelson::runtime::health::Readiness;
use keelson::runtime::{Context, Metrics, Settings};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::conditions;
use kube::runtime::wait::await_condition;
use testkit::{Cluster, TestNamespace};
use tokio::sync::watch;

pub const OPERATOR_SA: &str = "keelson";

/// The operator's image for MyDatabase pods' instance manager: this build's
/// `keelson` binary, imported into the real node once per build
/// (`hack/cluster.sh keelson-image`); `KEELSON_INSTANCE_IMAGE` overrides it.
pub fn instance_image() -> anyhow::Result<String> {
    static IMAGE: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    let made = IMAGE.get_or_init(|| {
        if let Ok(image) = std::env::var("KEELSON_INSTANCE_IMAGE") {
            return Ok(image);
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/cluster.sh");
        let output = std::process::Command::new(script)
            .args(["keelson-image", env!("CARGO_BIN_EXE_keelson")])
            .output()
            .map_err(|e| format!("cannot run {script}: {e}"))?;
        if !output.status.success() {
            return Err(format!("{script} keelson-image failed: {}", String::from_utf8_lossy(&output.stderr)));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    });
    made.clone().map_err(anyhow::Error::msg)
}

/// This build's `keelson` binary imported into the nodes again under `reference`
/// (a second operator version, for upgrade tests).
pub fn instance_image_named(reference: &str) -> anyhow::Result<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/cluster.sh");
    let output = std::process::Command::new(script)
        .args(["keelson-image", env!("CARGO_BIN_EXE_keelson"), reference])
        .output()
        .with_context(|| format!("cannot run {script}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{script} keelson-image failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Installs the generated CRDs and ClusterRole (idempotent, safe in parallel).
pub async fn install(cluster: &Cluster) -> anyhow::Result<()> {
    init_logging();
    let params = PatchParams::apply("keelson-tests").force();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    for crd in manifests::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &params, &Patch::Apply(&crd)).await.with_context(|| format!("install CRD {name}"))?;
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established"))??;
    }
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(cluster.client.clone());
    for role in [
        manifests::rbac::cluster_role(),
        manifests::rbac::node_reader_role(),
        manifests::rbac::metrics_auth_role(),
        manifests::rbac::metrics_reader_role(),
    ] {
        let name = role.metadata.name.clone().unwrap_or_default();
        roles
            .patch(&name, &params, &Patch::Apply(&role))
            .await
            .with_context(|| format!("install ClusterRole {name}"))?;
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(cluster.client.clone());
    let policy = manifests::admission::instance_policy();
    policies
        .patch(manifests::admission::POLICY_NAME, &params, &Patch::Apply(&policy))
        .await
        .context("install policy")?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(cluster.client.clone());
    let binding = manifests::admission::instance_policy_binding();
    bindings
        .patch(manifests::admission::POLICY_NAME, &params, &Patch::Apply(&binding))
        .await
        .context("install policy binding")?;
    Ok(())
}

/// Operator logs in test output; `RUST_LOG` overrides the default filter.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("keelson=info,kube=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// The operator's ServiceAccount, in `ns`.
async fn operator_service_account(ns: &TestNamespace) -> anyhow::Result<()> {
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(OPERATOR_SA.into()), ..Default::default() },
        ..Default::default()
    };
    let params = PatchParams::apply("keelson-tests").force();
    ns.api::<ServiceAccount>().patch(OPERATOR_SA, &params, &Patch::Apply(&sa)).await.context("operator SA")?;
    Ok(())
}

/// The operator's ServiceAccount in `ns`, bound to the generated ClusterRole
/// (within `ns`) and to the generated leader-election Role.
pub async fn grant_operator_rbac(cluster: &Cluster, ns: &TestNamespace) -> anyhow::Result<()> {
    install(cluster).await?;
    let params = PatchParams::apply("keelson-tests").force();
    operator_service_account(ns).await?;
    let leader_role = manifests::rbac::leader_election_role(&ns.name);
    ns.api::<Role>()
        .patch(manifests::rbac::LEADER_ROLE_NAME, &params, &Patch::Apply(&leader_role))
        .await
        .context("leader Role")?;
    for (name, kind) in
        [(manifests::rbac::CLUSTER_ROLE_NAME, "ClusterRole"), (manifests::rbac::LEADER_ROLE_NAME, "Role")]
    {
        let binding = RoleBinding {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: kind.into(),
                name: name.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: OPERATOR_SA.into(),
                namespace: Some(ns.name.clone()),
                ..Default::default()
            }]),
        };
        ns.api::<RoleBinding>().patch(name, &params, &Patch::Apply(&binding)).await.context("bind role")?;
    }
    bind_cluster_wide(cluster, ns, manifests::rbac::NODE_READER_ROLE_NAME, OPERATOR_SA).await?;
    bind_cluster_wide(cluster, ns, manifests::rbac::METRICS_AUTH_ROLE_NAME, OPERATOR_SA).await
}

/// Binds the ClusterRole `role` cluster-wide to the ServiceAccount `account` in `home`; the
/// binding goes with that namespace.
pub async fn bind_cluster_wide(
    cluster: &Cluster,
    home: &TestNamespace,
    role: &str,
    account: &str,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let owner = namespaces.get(&home.name).await.context("home namespace")?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("keelson-test-{}-{account}-{role}", home.name)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name: home.name.clone(),
                uid: owner.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(home.name.clone()),
            ..Default::default()
        }]),
    };
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.client.clone());
    let name = binding.metadata.name.clone().unwrap_or_default();
    let params = PatchParams::apply("keelson-tests").force();
    bindings.patch(&name, &params, &Patch::Apply(&binding)).await.with_context(|| format!("bind {role}"))?;
    Ok(())
}

pub struct TestOperator {
    pub metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TestOperator {
    /// Starts both controllers watching only `ns`, and waits for their caches.
    pub async fn start(cluster: &Cluster, ns: &TestNamespace) -> anyhow::Result<Self> {
        grant_operator_rbac(cluster, ns).await?;
        Self::start_as_service_account(cluster, ns).await
    }

    /// Starts the controllers again (e.g. after [`TestOperator::stop`]), with fresh metrics.
    pub async fn start_as_service_account(cluster: &Cluster, ns: &TestNamespace) -> anyhow::Result<Self> {
        Self::start_with_identity_in(cluster, ns, ns).await
    }

    /// Starts the controllers again as another operator version would: MyDatabase
    /// pods' instance manager from `image`.
    pub async fn start_with_instance_image(cluster: &Cluster, ns: &TestNamespace, image: &str) -> anyhow::Result<Self> {
        Self::start_with(cluster, ns, ns, image.to_string()).await
    }

    /// Starts the controllers watching `watched`, as a ServiceAccount that lives in
    /// `home` and holds the ClusterRole cluster-wide, as a deployed operator does:
    /// for tests that delete the watched namespace with everything in it.
    pub async fn start_from(cluster: &Cluster, home: &TestNamespace, watched: &TestNamespace) -> anyhow::Result<Self> {
        install(cluster).await?;
        operator_service_account(home).await?;
        bind_cluster_wide(cluster, home, manifests::rbac::CLUSTER_ROLE_NAME, OPERATOR_SA).await?;
        bind_cluster_wide(cluster, home, manifests::rbac::NODE_READER_ROLE_NAME, OPERATOR_SA).await?;
        Self::start_with_identity_in(cluster, home, watched).await
    }

    async fn start_with_identity_in(
        cluster: &Cluster,
        home: &TestNamespace,
        ns: &TestNamespace,
    ) -> anyhow::Result<Self> {
        Self::start_with(cluster, home, ns, instance_image()?).await
    }

    async fn start_with(
        cluster: &Cluster,
        home: &TestNamespace,
        ns: &TestNamespace,
        instance_image: String,
    ) -> anyhow::Result<Self> {
        let client = cluster.client_as_service_account(&home.name, OPERATOR_SA)?;
        let metrics = Arc::new(Metrics::default());
        // As the operator does: initial lists streamed where the API server supports it.
        let webapps: kube::Api<keelson::api::WebApp> = kube::Api::namespaced(client.clone(), &ns.name);
        let streaming_lists = keelson::runtime::cache::streaming_lists_supported(&webapps).await;
        let ctx = Context::new(client, metrics.clone(), Settings { instance_image, streaming_lists });
        let readiness = Readiness::default();
        let (stop, stop_rx) = watch::channel(false);
        let task =
            tokio::spawn(keelson::operator::run_controllers(ctx, Some(ns.name.clone()), 4, readiness.clone(), stop_rx));
        testkit::eventually(Duration::from_secs(60), "operator caches to sync", || {
            let ready = readiness.is_ready();
            async move { ready }
        })
        .await?;
        Ok(Self { metrics, stop, task })
    }

    /// Ends the controllers at once, mid-reconcile, as a killed process would:
    /// nothing in flight is finished, nothing it kept in memory survives.
    pub fn kill(self) {
        self.task.abort();
    }

    /// Stops the controllers, draining in-flight reconciles.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(30), self.task).await.context("operator did not stop")??;
        Ok(())
    }

    pub fn counter(&self, name: &str) -> u64 {
        // Sums every series of a counter in the rendered text, e.g. `keelson_child_writes_total`.
        testkit::process::metric_sum(&self.metrics.render(), name) as u64
    }
}

/// A namespace for one test; MyDatabase finalizers in it are cleared when it
/// goes, since the in-process operator that would clear them stops with the test.
pub async fn namespace(cluster: &Cluster, test_name: &str) -> anyhow::Result<TestNamespace> {
    let mut ns = cluster.namespace(test_name).await?;
    ns.clear_finalizers_on_drop::<keelson::api::MyDatabase>();
    Ok(ns)
}

/// A namespace for one test whose pods run real containers on the real node.
pub async fn real_namespace(cluster: &Cluster, test_name: &str) -> anyhow::Result<TestNamespace> {
    let mut ns = cluster.real_namespace(test_name).await?;
    ns.clear_finalizers_on_drop::<keelson::api::MyDatabase>();
    Ok(ns)
}

/// A MyDatabase Running with `replicas` ready instances, as of its latest spec.
pub fn running(replicas: i32) -> impl Fn(&keelson::api::MyDatabase) -> bool {
    move |db| {
        db.status.as_ref().is_some_and(|s| {
            s.phase == Some(keelson::api::mydatabase::DatabasePhase::Running)
                && s.ready_replicas == replicas
                && s.observed_generation == db.metadata.generation
        })
    }
}
