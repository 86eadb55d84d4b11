//! Stage 1, read: what the cluster holds for one MyDatabase, from the watch
//! caches. Only the credentials and the CA are confirmed with the API server
//! when the cache has none: generating new passwords or a new CA over
//! existing ones would lock the database's users out.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::names;
use super::watches::Caches;
use crate::api::MyDatabase;
use crate::runtime::cache;
use crate::runtime::ownership::labelled_for;
use crate::{Error, Result};

/// What the cluster holds for one MyDatabase; apply updates it with what it wrote.
#[derive(Debug, Default)]
pub struct Observed {
    pub credentials: Option<Secret>,
    /// The replication role's password (`<name>-replication`).
    pub replication: Option<Secret>,
    /// The superuser's password (`<name>-superuser`), with `spec.superuserAccess`.
    pub superuser: Option<Secret>,
    /// The database's CA (`<name>-ca`) and the instances' certificate (`<name>-server`).
    pub ca: Option<Secret>,
    pub server_tls: Option<Secret>,
    /// The Secret named by `spec.tls.serverSecret` (not Keelson's: read, never written).
    pub user_server_tls: Option<Secret>,
    /// When the server certificate is due for renewal (set by build's reading of it).
    pub certificate_renewal_in: Option<std::time::Duration>,
    pub statefulset: Option<StatefulSet>,
    /// Database pods, by name.
    pub pods: Vec<Pod>,
    /// Backup Jobs of the CronJob and the final backup.
    pub backup_jobs: Vec<Job>,
    /// Pods of the backup Jobs (their termination message names the backup).
    pub backup_pods: Vec<Pod>,
    /// Data volumes, by name.
    pub data_claims: Vec<PersistentVolumeClaim>,
    pub backups_claim: Option<PersistentVolumeClaim>,
    pub backup_cron_job: Option<CronJob>,
    /// With `spec.restoreFrom`: the source's backups volume, the restore Job and its pods.
    pub restore_source: Option<PersistentVolumeClaim>,
    pub restore_job: Option<Job>,
    pub restore_pods: Vec<Pod>,
    /// The primary Keelson chose (set by apply), and its pod's uid when chosen.
    pub primary: Option<String>,
    pub primary_uid: Option<String>,
    /// A failover waits for the replicas' positions (set by apply).
    pub failover_pending: bool,
    /// The newest failover this operator decided (set by apply).
    pub failover: Option<crate::api::mydatabase::FailoverRecord>,
    /// A replica rebuild newer than the one status records (set by apply).
    pub replica_rebuild: Option<crate::api::mydatabase::ReplicaRebuild>,
    /// Why a failover may not promote anyone yet (set by apply).
    pub failover_blocked: Option<String>,
    /// `status.asynchronous` as it stands (set by apply; else as status has it).
    pub asynchronous: Option<crate::api::mydatabase::AsynchronousPeriod>,
    /// When to look at the primary's standbys again (set by apply).
    pub synchronous_recheck: Option<std::time::Duration>,
    /// When the primary's lease expires unless renewed (set by apply).
    pub lease_expires_in: Option<std::time::Duration>,
    /// The backup request whose Job exists (set by apply).
    pub backup_request: Option<String>,
    /// Why a new operator's pod template waits (set by apply).
    pub restart_pending: Option<String>,
    /// The instance managers against this operator's image (set by apply).
    pub managers: Option<super::upgrade::Managers>,
}

/// A Secret of this database's from the cache, else (when `confirm`) from the API server: a
/// cache that has not seen it yet must not pass for its absence where a new one would replace
/// what clients hold. A stranger's Secret of that name is never read (applying over it is refused).
async fn own_secret(
    db: &MyDatabase,
    caches: &Caches,
    client: &Client,
    name: String,
    confirm: bool,
) -> Result<Option<Secret>> {
    let namespace = db.namespace().unwrap_or_default();
    let secret = match cache::get(&caches.secrets, &namespace, &name) {
        Some(secret) => Some(secret),
        None if !confirm => None,
        None => Api::<Secret>::namespaced(client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("read Secret {name}")))?,
    };
    Ok(secret.filter(|secret| labelled_for(secret, &db.name_any())))
}

pub async fn read(db: &MyDatabase, caches: &Caches, client: &Client) -> Result<Observed> {
    caches.synced().await?;
    let namespace = db.namespace().unwrap_or_default();
    let credentials = own_secret(db, caches, client, names::credentials(db), true).await?;
    // The others are confirmed the same way unless the database is new (no credentials anywhere):
    // the superuser's while access is on (a new password would lock the DBA out), the CA (a new one
    // would break every client that trusts it), and the certificate once the CA exists (one issued
    // over one the cache has not seen yet would be a needless change, a reload on every instance).
    let existing = credentials.is_some();
    let replication = own_secret(db, caches, client, names::replication_secret(db), existing).await?;
    let superuser_access = existing && db.spec.superuser_access;
    let superuser = own_secret(db, caches, client, names::superuser_secret(db), superuser_access).await?;
    let ca = own_secret(db, caches, client, names::ca_secret(db), existing).await?;
    let server_tls = own_secret(db, caches, client, names::server_secret(db), ca.is_some()).await?;
    // A user's Secret carries none of Keelson's labels, so no watch caches it: read on each reconcile.
    let user_server_tls = match &db.spec.tls {
        Some(tls) => Api::<Secret>::namespaced(client.clone(), &namespace)
            .get_opt(&tls.server_secret)
            .await
            .map_err(Error::kube("read the Secret named by spec.tls.serverSecret"))?,
        None => None,
    };
    let statefulset = cache::get(&caches.statefulsets, &namespace, &names::statefulset(db));
    let pods = own_pods(cache::list(&caches.pods, &namespace, &names::pod_selector(db)), statefulset.as_ref());
    Ok(Observed {
        credentials,
        replication,
        superuser,
        ca,
        server_tls,
        user_server_tls,
        certificate_renewal_in: None,
        statefulset,
        pods,
        backup_jobs: cache::list(&caches.jobs, &namespace, &names::labels(db, "backup")),
        backup_pods: cache::list(&caches.pods, &namespace, &names::labels(db, "backup")),
        data_claims: cache::list(&caches.claims, &namespace, &names::pod_selector(db)),
        backups_claim: cache::get(&caches.claims, &namespace, &names::backups_pvc(db)),
        backup_cron_job: cache::get(&caches.cron_jobs, &namespace, &names::backup_cronjob(db)),
        restore_source: db
            .spec
            .restore_from
            .as_ref()
            .and_then(|from| cache::get(&caches.claims, &namespace, &names::backups_pvc_of(&from.database))),
        restore_job: cache::get(&caches.jobs, &namespace, &names::restore_job(db)),
        restore_pods: cache::list(&caches.pods, &namespace, &names::labels(db, "restore")),
        primary: None,
        primary_uid: None,
        failover_pending: false,
        failover: None,
        failover_blocked: None,
        asynchronous: db.status.as_ref().and_then(|s| s.asynchronous.clone()),
        synchronous_recheck: None,
        replica_rebuild: None,
        lease_expires_in: None,
        restart_pending: None,
        managers: None,
        backup_request: None,
    })
}

/// The database's pods: those its StatefulSet controls. A pod that only
/// carries the labels (anyone who may create pods in the namespace can make
/// one) is never a candidate for primary, nor counted, nor relabelled.
fn own_pods(pods: Vec<Pod>, statefulset: Option<&StatefulSet>) -> Vec<Pod> {
    let Some(uid) = statefulset.and_then(|s| s.metadata.uid.as_deref()) else { return Vec::new() };
    pods.into_iter()
        .filter(|pod| {
            pod.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|owner| owner.controller == Some(true) && owner.kind == "StatefulSet" && owner.uid == uid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(name: &str, owner_uid: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.owner_references = owner_uid.map(|uid| {
            vec![OwnerReference {
                kind: "StatefulSet".into(),
                name: "db".into(),
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        pod
    }

    #[test]
    fn only_pods_our_statefulset_controls_are_the_databases() {
        let mut statefulset = StatefulSet::default();
        statefulset.metadata.uid = Some("ours".into());
        let pods = vec![pod("db-0", Some("ours")), pod("db-1", Some("someone-elses")), pod("db-9", None)];
        let kept: Vec<String> = own_pods(pods.clone(), Some(&statefulset)).iter().map(|p| p.name_any()).collect();
        assert_eq!(kept, ["db-0"]);
        assert!(own_pods(pods, None).is_empty(), "no StatefulSet yet: no pods of ours");
    }
}
