//! The local cluster's dynamic volume provisioner, behind the default
//! StorageClass `keelson-local` (hack/cluster/storage.sh starts it).
//!
//! Each claim gets a folder on this host, published as a `local`
//! PersistentVolume pinned to the node the scheduler chose: the kubelet
//! applies the pod's `fsGroup` to it (unlike `hostPath`), and its data
//! outlives the pod. Claims grow on request (the size is nominal: a folder has
//! no quota). Released volumes whose reclaim policy is `Delete` go with their
//! folder. Claims on KWOK's fake nodes get a folder too; nothing mounts it.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tracing::{info, warn};

const PROVISIONER: &str = "keelson.dev/local-volume";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const RETRY: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(about = "Dynamic provisioner of host folders as local PersistentVolumes (local cluster only)")]
struct Args {
    /// Folder under which each volume gets a folder of its own.
    #[arg(long)]
    root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{action} {object}: {source}")]
    Api { action: &'static str, object: String, source: kube::Error },
    #[error("{action} {path}: {source}")]
    Folder { action: &'static str, path: PathBuf, source: std::io::Error },
}

struct Context {
    client: Client,
    root: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_ansi(false).with_env_filter(tracing_subscriber::EnvFilter::new("info")).init();
    let args = Args::parse();
    std::fs::create_dir_all(&args.root)?;
    let client = Client::try_default().await?;
    let ctx = Arc::new(Context { client: client.clone(), root: args.root });
    info!(root = %ctx.root.display(), provisioner = PROVISIONER, "serving claims");
    let claims = Controller::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default())
        .run(reconcile_claim, retry, ctx.clone())
        .for_each(|_| async {});
    let volumes = Controller::new(Api::<PersistentVolume>::all(client), watcher::Config::default())
        .run(reconcile_volume, retry, ctx)
        .for_each(|_| async {});
    tokio::select! {
        _ = claims => {},
        _ = volumes => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    Ok(())
}

fn retry<K>(_: Arc<K>, error: &Error, _: Arc<Context>) -> Action {
    warn!(%error, "will retry");
    Action::requeue(RETRY)
}

fn storage_request(claim: &PersistentVolumeClaim) -> Option<Quantity> {
    claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage").cloned()
}

async fn reconcile_claim(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    if claim.annotations().get(STORAGE_PROVISIONER).map(String::as_str) != Some(PROVISIONER) {
        return Ok(Action::await_change());
    }
    let Some(request) = storage_request(&claim) else { return Ok(Action::await_change()) };
    match claim.spec.as_ref().and_then(|s| s.volume_name.clone()) {
        None => provision(&claim, request, &ctx).await?,
        Some(volume) => grow(&claim, &volume, request, &ctx).await?,
    }
    Ok(Action::await_change())
}

/// A folder and a PersistentVolume bound in advance to the claim, on the node
/// the scheduler selected (the StorageClass waits for the first consumer).
async fn provision(claim: &PersistentVolumeClaim, request: Quantity, ctx: &Context) -> Result<(), Error> {
    let Some(node) = claim.annotations().get(SELECTED_NODE).cloned() else { return Ok(()) };
    let (namespace, name, uid) =
        (claim.namespace().unwrap_or_default(), claim.name_any(), claim.uid().unwrap_or_default());
    let volume_name = format!("pvc-{uid}");
    let path = ctx.root.join(&volume_name);
    std::fs::create_dir_all(&path).map_err(|source| Error::Folder { action: "create", path: path.clone(), source })?;
    // Anyone may write, as with local-path-provisioner; the kubelet narrows it to the pod's fsGroup.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).map_err(|source| Error::Folder {
        action: "open up",
        path: path.clone(),
        source,
    })?;
    let spec = claim.spec.clone().unwrap_or_default();
    let class_name = spec.storage_class_name.clone().unwrap_or_default();
    let reclaim = Api::<StorageClass>::all(ctx.client.clone())
        .get_opt(&class_name)
        .await
        .map_err(|source| Error::Api { action: "read", object: format!("StorageClass {class_name}"), source })?
        .and_then(|class| class.reclaim_policy)
        .unwrap_or_else(|| "Delete".into());
    let volume = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(volume_name.clone()),
            annotations: Some(BTreeMap::from([(PROVISIONED_BY.into(), PROVISIONER.into())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".into(), request)])),
            access_modes: spec.access_modes.clone(),
            volume_mode: spec.volume_mode.clone(),
            storage_class_name: Some(class_name),
            persistent_volume_reclaim_policy: Some(reclaim),
            local: Some(LocalVolumeSource { path: path.display().to_string(), fs_type: None }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node.clone()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            claim_ref: Some(ObjectReference {
                kind: Some("PersistentVolumeClaim".into()),
                api_version: Some("v1".into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                uid: Some(uid),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    match Api::<PersistentVolume>::all(ctx.client.clone()).create(&PostParams::default(), &volume).await {
        Ok(_) => info!(claim = %format!("{namespace}/{name}"), volume = %volume_name, %node, "provisioned"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(source) => {
            return Err(Error::Api { action: "create", object: format!("PersistentVolume {volume_name}"), source });
        }
    }
    Ok(())
}

/// Grows a bound claim's volume to its request, then reports the new
/// capacity on the claim, as an external resizer does.
async fn grow(claim: &PersistentVolumeClaim, volume_name: &str, request: Quantity, ctx: &Context) -> Result<(), Error> {
    let volumes = Api::<PersistentVolume>::all(ctx.client.clone());
    let object = format!("PersistentVolume {volume_name}");
    let Some(volume) = volumes.get_opt(volume_name).await.map_err(|source| Error::Api {
        action: "read",
        object: object.clone(),
        source,
    })?
    else {
        return Ok(());
    };
    if volume.annotations().get(PROVISIONED_BY).map(String::as_str) != Some(PROVISIONER) {
        return Ok(());
    }
    let capacity = volume.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
    if capacity != Some(&request) {
        volumes
            .patch(
                volume_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"capacity": {"storage": request}}})),
            )
            .await
            .map_err(|source| Error::Api { action: "grow", object, source })?;
    }
    let status = claim.status.as_ref();
    let bound = status.and_then(|s| s.phase.as_deref()) == Some("Bound");
    let reported = status.and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
    if bound && reported != Some(&request) {
        let (namespace, name) = (claim.namespace().unwrap_or_default(), claim.name_any());
        let patch = json!({"status": {
            "capacity": {"storage": request},
            "allocatedResources": {"storage": request},
            "allocatedResourceStatuses": null,
            "conditions": null,
        }});
        Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| Error::Api {
                action: "report the size of",
                object: format!("claim {namespace}/{name}"),
                source,
            })?;
        info!(claim = %format!("{namespace}/{name}"), size = %request.0, "grown");
    }
    Ok(())
}

/// Removes a released volume of ours, and its folder, when its policy says so.
async fn reconcile_volume(volume: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ours = volume.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER);
    let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    let spec = volume.spec.as_ref();
    let delete = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
    if !ours || !delete || !matches!(phase, Some("Released" | "Failed")) || volume.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let name = volume.name_any();
    let path = ctx.root.join(&name);
    if let Some(local) = spec.and_then(|s| s.local.as_ref()).map(|l| Path::new(&l.path))
        && local != path
    {
        warn!(volume = %name, path = %local.display(), "not under our root; keeping its folder");
    } else if path.exists() {
        std::fs::remove_dir_all(&path).map_err(|source| Error::Folder {
            action: "remove",
            path: path.clone(),
            source,
        })?;
    }
    match Api::<PersistentVolume>::all(ctx.client.clone()).delete(&name, &DeleteParams::default()).await {
        Ok(_) => info!(volume = %name, "deleted with its folder"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(source) => return Err(Error::Api { action: "delete", object: format!("PersistentVolume {name}"), source }),
    }
    Ok(Action::await_change())
}
