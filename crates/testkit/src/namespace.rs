//! One namespace per test, removed when the test ends, pass or fail.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use rand::Rng;

/// Where a namespace's pods run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nodes {
    /// KWOK's fake nodes: pods are Running at once and run nothing. For tests
    /// of API objects and of thousands of them.
    Fake,
    /// The real node: real containers from the images built on this machine.
    Real,
}

/// Annotations that send every pod of a namespace to KWOK's tainted nodes
/// (the API server's PodNodeSelector and PodTolerationRestriction plugins).
fn fake_node_annotations() -> std::collections::BTreeMap<String, String> {
    [
        ("scheduler.alpha.kubernetes.io/node-selector".to_string(), "type=kwok".to_string()),
        (
            "scheduler.alpha.kubernetes.io/defaultTolerations".to_string(),
            r#"[{"key":"kwok.x-k8s.io/node","operator":"Exists","effect":"NoSchedule"}]"#.to_string(),
        ),
    ]
    .into()
}

pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    config: kube::Config,
    keep: bool,
    /// Kinds whose finalizers are cleared before the namespace goes: their
    /// controller stops with the test and could never clear them.
    finalized_kinds: Vec<ApiResource>,
    /// A real-node namespace holds one of the process's slots while it lives.
    _slot: Option<RealSlot>,
}

/// How many namespaces with real pods one test binary runs at once
/// (`KEELSON_REAL_TESTS`, default 3): each is a database of two or three
/// PostgreSQL servers, and the machine has two cores. Beyond that, their
/// probes starve, and a primary under no fault is taken for hung (with 4,
/// a just-promoted primary under a clone and a rewind beside it stopped
/// answering for over 15 s in about one full run in three).
fn real_slots() -> usize {
    std::env::var("KEELSON_REAL_TESTS").ok().and_then(|n| n.parse().ok()).filter(|n| *n > 0).unwrap_or(3)
}

static REAL_IN_USE: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static REAL_FREED: std::sync::Condvar = std::sync::Condvar::new();

/// One of the slots (see [`real_slots`]), given back when dropped.
struct RealSlot;

impl RealSlot {
    async fn acquire() -> Self {
        let waiting = tokio::task::spawn_blocking(|| {
            let mut in_use = REAL_IN_USE.lock().unwrap_or_else(|p| p.into_inner());
            while *in_use >= real_slots() {
                in_use = REAL_FREED.wait(in_use).unwrap_or_else(|p| p.into_inner());
            }
            *in_use += 1;
        });
        let _ = waiting.await;
        RealSlot
    }
}

impl Drop for RealSlot {
    fn drop(&mut self) {
        let mut in_use = REAL_IN_USE.lock().unwrap_or_else(|p| p.into_inner());
        *in_use = in_use.saturating_sub(1);
        REAL_FREED.notify_one();
    }
}

impl TestNamespace {
    pub(crate) async fn create(
        client: Client,
        config: kube::Config,
        test_name: &str,
        nodes: Nodes,
    ) -> anyhow::Result<Self> {
        let slot = match nodes {
            Nodes::Real => Some(RealSlot::acquire().await),
            Nodes::Fake => None,
        };
        let suffix: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(6)
            .map(|c| char::from(c).to_ascii_lowercase())
            .collect();
        let stem: String = test_name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .take(40)
            .collect();
        let name = format!("t-{}-{suffix}", stem.trim_matches('-'));
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("keelson.dev/test".to_string(), "true".to_string())].into()),
                annotations: (nodes == Nodes::Fake).then(fake_node_annotations),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("cannot create namespace {name}"))?;
        let keep = std::env::var("KEELSON_KEEP_NAMESPACES").is_ok_and(|v| v == "1");
        Ok(Self { name, client, config, keep, finalized_kinds: Vec::new(), _slot: slot })
    }

    /// Clears the finalizers of every `K` in this namespace before deleting it.
    pub fn clear_finalizers_on_drop<K: kube::Resource<DynamicType = ()>>(&mut self) {
        self.finalized_kinds.push(ApiResource::erase::<K>(&()));
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("keeping namespace {} (KEELSON_KEEP_NAMESPACES=1)", self.name);
            return;
        }
        let name = self.name.clone();
        let config = self.config.clone();
        let kinds = self.finalized_kinds.clone();
        // Drop cannot await; delete from a thread with its own runtime and its
        // own client (the test's client is served by the runtime blocked here),
        // so the namespace goes even when the test panicked.
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let client = Client::try_from(config).ok()?;
                for kind in &kinds {
                    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &name, kind);
                    for object in api.list_metadata(&ListParams::default()).await.ok()?.items {
                        if object.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
                            let patch = serde_json::json!({"metadata": {"finalizers": null}});
                            let _ = api.patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await;
                        }
                    }
                }
                Api::<Namespace>::all(client).delete(&name, &DeleteParams::background()).await.ok()
            })?;
            Some(())
        })
        .join();
        if !matches!(deleted, Ok(Some(()))) {
            eprintln!("could not delete test namespace {}", self.name);
        }
    }
}
