//! One MyDatabase reconcile, stage by stage (see `runtime::pipeline`): read
//! from the caches → validate what the schema cannot → build every child →
//! apply them in order (configuration, then the StatefulSet, then what
//! depends on it) → status from the StatefulSet and the backup Jobs.
//! Deletion runs `deletion::clean_up` under the finalizer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::failover::{self, Decision};
use super::instance_access::{self, InstanceAccess};
use super::observed::{self, Observed};
use super::restore::{self, Progress, Restore};
use super::rollout::{self, Step};
use super::statefulset::TemplateChange;
use super::upgrade::{self, Template};
use super::watches::Caches;
use super::{
    backup, credentials, deletion, drain, instances, names, network_policy, pdb, scripts, services, statefulset,
    status, synchronous, tls, validation,
};
use crate::Result;
use crate::api::instance::{
    FENCE, FENCE_REASON, HOLD_STREAMING, LEASE, LEASE_EXPIRES_AFTER, POSITION_REQUEST, Role, SYNCHRONOUS_STANDBYS,
    UPSTREAM, UPSTREAM_SSLMODE,
};
use crate::api::mydatabase::{
    AsynchronousPeriod, BACKUP_REQUEST_ANNOTATION, FORCE_FAILOVER_ANNOTATION, FailoverRecord, MyDatabase,
    MyDatabaseStatus, ReplicationMode, SWITCHOVER_ANNOTATION, is_fenced,
};
use crate::runtime::{Applier, Context, Invalid, Outcome, Reconciler, Settings};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub const CONTROLLER: &str = "mydatabase";
pub const FINALIZER: &str = "db.keelson.dev/cleanup";

pub struct MyDatabaseReconciler {
    pub ctx: Arc<Context>,
    pub caches: Caches,
    /// What this process decided about each database's primary (by
    /// `namespace/name`): it outranks the caches, which may lag its own writes.
    pub primaries: Mutex<HashMap<String, PrimaryState>>,
}

/// This process's decisions about one database's primary.
#[derive(Clone, Debug, Default)]
pub struct PrimaryState {
    /// The primary chosen last (labels and status follow it), and its pod's uid.
    chosen: Option<String>,
    chosen_uid: Option<String>,
    /// A failover or switchover under way.
    pending: Option<Pending>,
    /// The newest failover or switchover decided: status carries it even when
    /// a reconcile reads a cached MyDatabase from before that status write.
    last: Option<FailoverRecord>,
    /// When `last` began, to measure its write downtime (status times are whole seconds).
    last_began: Option<Instant>,
    /// Why the failover under way may not promote anyone (quorum), for status.
    blocked: Option<String>,
    /// The primary's lease as last seen moving: its pod, its count, and when.
    lease_seen: Option<(String, String, Instant)>,
    /// The replicas seen streaming from the chosen primary (its reports), for the quorum.
    streamed: std::collections::BTreeSet<String>,
    /// `status.asynchronous` as this process last decided it (None: not yet; then status says).
    asynchronous: Option<Option<AsynchronousPeriod>>,
    /// What `synchronous::step` saw of the primary's standbys, and when to look again.
    synchronous: synchronous::Watch,
    synchronous_recheck: Option<Duration>,
    /// The Event of a failover blocked on the lost primary itself was sent.
    told_alone: bool,
}

/// A failover or switchover waiting for the replicas' positions.
#[derive(Clone, Debug)]
struct Pending {
    /// The position request sent, and when (monotonic and wall clock).
    token: String,
    asked_at: Instant,
    /// When the primary stopped taking writes, as far as Keelson can tell: its
    /// lease's last renewal seen, or the moment the loss was seen.
    began: Instant,
    lost_at: Time,
    /// Why the primary counted as lost when the failover began (fencing may add reasons later).
    why: String,
    switchover: Option<Switchover>,
    /// When the replicas were told to hold (stop streaming): only if they
    /// still stream after the wait (the old primary's end, a clean shutdown
    /// or the kubelet's kill, normally ends their streams first).
    held_at: Option<Instant>,
    /// The blocked failover's Event was sent.
    blocked_told: bool,
}

#[derive(Clone, Debug)]
struct Switchover {
    to: String,
    why: String,
    /// Asked for by the annotation (removed when done).
    requested: bool,
}

/// How long a failover or switchover waits for its replicas to stop streaming
/// on their own before they are told to hold, and how long held replicas may take to
/// answer before a failover says it is blocked.
const POSITION_WAIT: Duration = Duration::from_secs(3);

/// How often a Secret named by `spec.tls.serverSecret` is read again: while it
/// is missing or not usable, and once it is (its CA may change).
const USER_CERTIFICATE_WAIT: Duration = Duration::from_secs(10);
const USER_CERTIFICATE_RECHECK: Duration = Duration::from_secs(300);

/// Every child the spec asks for; None where an optional one is switched off.
pub struct Desired {
    credentials: Secret,
    replication: Secret,
    superuser: Option<Secret>,
    /// Keelson's CA and certificate; None with a user's (`spec.tls.serverSecret`).
    ca: Option<Secret>,
    server_tls: Option<Secret>,
    certificate_renewal_in: Option<Duration>,
    scripts: ConfigMap,
    instance_access: InstanceAccess,
    services: [Service; 3],
    backups_claim: Option<PersistentVolumeClaim>,
    restore: Option<Restore>,
    statefulset: Template,
    disruption_budgets: pdb::Budgets,
    network_policy: Option<NetworkPolicy>,
    backup_cron_job: Option<CronJob>,
    /// A backup requested now and not yet taken: its token and Job.
    requested_backup: Option<(String, Job)>,
}

impl Reconciler for MyDatabaseReconciler {
    type Object = MyDatabase;
    type Observed = Observed;
    type Desired = Desired;
    type Status = MyDatabaseStatus;
    const CONTROLLER: &'static str = CONTROLLER;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn read(&self, db: &MyDatabase) -> Result<Observed> {
        let mut observed = observed::read(db, &self.caches, &self.ctx.client).await?;
        // This process's record outranks a cached MyDatabase from before its write (a status
        // written without an apply, when paused or invalid, must not drop it).
        observed.asynchronous = self.asynchronous(db);
        Ok(observed)
    }

    fn validate(db: &MyDatabase, observed: &Observed) -> Result<(), Invalid> {
        validation::validate(&db.spec)?;
        super::resources::validate(db)?;
        tls::user_certificate(db, observed.user_server_tls.as_ref()).map(|_| ())
    }

    fn build(&self, db: &MyDatabase, observed: &Observed) -> Result<Desired> {
        let passwords = credentials::passwords(observed.credentials.as_ref(), observed.replication.as_ref());
        let now = chrono::Utc::now();
        // A user's certificate (validate refused one that is not usable), else Keelson's own.
        let user_ca = tls::user_certificate(db, observed.user_server_tls.as_ref()).ok().flatten();
        let issued = match user_ca {
            Some(_) => None,
            None => Some(tls::certificates(db, observed.ca.as_ref(), observed.server_tls.as_ref(), now)?),
        };
        let client_ca = user_ca.or_else(|| issued.as_ref().map(|c| c.ca_cert.clone())).unwrap_or_default();
        let verify_server = tls::served(observed.statefulset.as_ref(), &observed.pods);
        let superuser_password = db
            .spec
            .superuser_access
            .then(|| credentials::superuser_password(observed.superuser.as_ref(), observed.replication.as_ref()));
        let backups_claim = db.spec.backup.is_some().then(|| backup::volume_claim(db));
        let scripts = scripts::build(db)?;
        let scripts_hash = statefulset::scripts_hash(&scripts)?;
        Ok(Desired {
            credentials: credentials::build(db, &passwords, &client_ca, verify_server)?,
            replication: credentials::build_replication(db, &passwords, superuser_password.as_deref()),
            superuser: superuser_password
                .map(|password| credentials::build_superuser(db, &password, &client_ca))
                .transpose()?,
            ca: issued.as_ref().map(|certificates| tls::build_ca(db, certificates)),
            server_tls: issued.as_ref().map(|certificates| tls::build_server(db, certificates)).transpose()?,
            certificate_renewal_in: issued.as_ref().map(|certificates| tls::renewal_in(certificates, now)),
            scripts,
            instance_access: instance_access::build(db)?,
            services: services::build(db)?,
            backups_claim,
            restore: restore::build(db)?,
            statefulset: upgrade::template(
                db,
                &self.ctx.settings.instance_image,
                observed.statefulset.as_ref(),
                |image| self.statefulset(db, &observed.pods, image, &scripts_hash),
            )?,
            disruption_budgets: pdb::build(db)?,
            network_policy: network_policy::build(db)?,
            backup_cron_job: backup::cronjob(db, verify_server)?,
            requested_backup: match db.annotations().get(BACKUP_REQUEST_ANNOTATION) {
                Some(token) if db.status.as_ref().and_then(|s| s.last_backup_request.as_ref()) != Some(token) => {
                    backup::requested_job(db, token, verify_server)?.map(|job| (token.clone(), job))
                }
                _ => None,
            },
        })
    }

    async fn apply(&self, db: &MyDatabase, observed: Observed, desired: Desired, applier: &Applier<'_>) -> Observed {
        let caches = &self.caches;
        // Figures from status as series (also after an operator restart, when status does not change).
        if let Some(status) = &db.status {
            let finished_at = status.last_backup_time.as_ref().map(|t| t.0.as_second());
            let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
            self.ctx.metrics.record_backup(&namespace, &name, finished_at, status.last_backup_size_bytes);
        }
        let replica_rebuild = instances::newest_rebuild(&observed.pods, status::rebuilds_since(db));
        if let Some(rebuild) = &replica_rebuild {
            // Healing worth knowing of: a replica's data could not follow, and was replaced.
            let note = format!("{} was cloned afresh from the primary: {}", rebuild.instance, rebuild.reason);
            tracing::warn!(namespace = db.namespace().unwrap_or_default(), name = db.name_any(), "{note}");
            self.ctx.event(&db.object_ref(&()), EventType::Warning, "ReplicaRebuilt", "Clone", note).await;
        }
        sync_fences(db, &observed.pods, applier).await;
        let name = names::statefulset(db);
        // The replication password first: once it has its own Secret, the credentials may drop it.
        let replication = applier.apply(&caches.secrets, desired.replication).await;
        // The CA before the credentials that hand it to clients, and the certificate it signs.
        let (ca, server_tls) = match (desired.ca, desired.server_tls) {
            (Some(ca), Some(server)) => {
                let ca = applier.apply(&caches.secrets, ca).await;
                let server = match ca {
                    Some(_) => applier.apply(&caches.secrets, server).await,
                    None => observed.server_tls.clone(),
                };
                (ca, server)
            }
            _ => (observed.ca.clone(), observed.server_tls.clone()),
        };
        // The user's certificate, validated: nothing of Keelson's to issue.
        let user_tls = db.spec.tls.is_some() && observed.user_server_tls.is_some();
        let credentials = match (&replication, ca.is_some() || user_tls) {
            (Some(_), true) => applier.apply(&caches.secrets, desired.credentials).await,
            _ => observed.credentials.clone(),
        };
        let superuser = applier.apply_optional(&caches.secrets, &names::superuser_secret(db), desired.superuser).await;
        applier.apply(&caches.config_maps, desired.scripts).await;
        let InstanceAccess { service_account, role, role_binding } = desired.instance_access;
        applier.apply(&caches.service_accounts, service_account).await;
        applier.apply(&caches.roles, role).await;
        applier.apply(&caches.role_bindings, role_binding).await;
        for service in desired.services {
            applier.apply(&caches.services, service).await;
        }
        // Before the instances exist: no moment where they take connections from anywhere (a
        // first StatefulSet waits for it; a running database's is not held back by it).
        let wants_policy = desired.network_policy.is_some();
        let policy = names::network_policy(db);
        let policy = applier.apply_optional(&caches.network_policies, &policy, desired.network_policy).await;
        let unprotected = wants_policy && policy.is_none();
        let backups_claim = match desired.backups_claim {
            Some(claim) => applier.apply(&caches.claims, claim).await,
            None => observed.backups_claim.clone(),
        };
        // Pods and Jobs mount these Secrets: not before they are this database's own (a
        // stranger's Secret of that name is refused above, and must not reach a pod).
        let secrets_ours = credentials.is_some() && replication.is_some() && (server_tls.is_some() || user_tls);
        // With spec.restoreFrom, the first instance starts only on restored data.
        let restored = match (restore::progress(db, &observed), desired.restore) {
            _ if !secrets_ours => false,
            (Progress::NotNeeded | Progress::Done, _) => true,
            (Progress::SourceMissing { volume }, _) => {
                applier.wait(format!("the backups volume {volume} named by spec.restoreFrom.database"));
                false
            }
            (Progress::NotAllowed { volume }, _) => {
                applier.wait(format!("the source to allow restores from {volume} (spec.restoreTo)"));
                false
            }
            (Progress::Running, Some(restore)) => {
                applier.apply(&caches.claims, restore.data_claim).await;
                applier.apply(&caches.jobs, restore.job).await;
                applier.wait(format!("Job {} to restore the data", names::restore_job(db)));
                false
            }
            (Progress::Running | Progress::Failed { .. }, _) => false,
        };
        let mut restart_pending = None;
        let statefulset = match statefulset::template_change(db, observed.statefulset.as_ref()) {
            _ if !restored => None,
            _ if unprotected && observed.statefulset.is_none() => {
                applier.wait(format!("NetworkPolicy {} before the first instance", names::network_policy(db)));
                None
            }
            TemplateChange::None => match desired.statefulset {
                Template::Apply(statefulset) => applier.apply(&caches.statefulsets, *statefulset).await,
                Template::Held(fields) => {
                    restart_pending = Some(upgrade::held_message(&fields));
                    observed.statefulset.clone()
                }
            },
            TemplateChange::Recreating => {
                applier.wait(format!("StatefulSet {name} to be recreated with its new template"));
                observed.statefulset.clone()
            }
            TemplateChange::Grow { from } => {
                self.grow_storage(db, &observed, &from, applier).await;
                observed.statefulset.clone()
            }
            TemplateChange::Migrate { from } => {
                let note = format!(
                    "pod management {from} → {}: recreating the StatefulSet (pods keep running), so that the \
                     primary's pod is never held back behind another",
                    statefulset::POD_MANAGEMENT
                );
                self.recreate_statefulset(db, &observed, "StatefulSetMigrating", note, applier).await;
                observed.statefulset.clone()
            }
        };
        let pdb::Budgets { replicas: replicas_budget, primary: primary_budget } = desired.disruption_budgets;
        applier.apply_optional(&caches.disruption_budgets, &name, replicas_budget).await;
        applier.apply_optional(&caches.disruption_budgets, &names::primary_budget(db), primary_budget).await;
        let backup_cron_job = match secrets_ours {
            true => {
                applier.apply_optional(&caches.cron_jobs, &names::backup_cronjob(db), desired.backup_cron_job).await
            }
            false => observed.backup_cron_job.clone(),
        };
        // A backup requested now: its Job once (a finished one is removed after a day; the token
        // taken stays in status, so it is not run again).
        let backup_request = match desired.requested_backup {
            Some((token, job)) if secrets_ours && backup_cron_job.is_some() => {
                let name = job.metadata.name.clone().unwrap_or_default();
                let exists = observed.backup_jobs.iter().any(|j| j.name_any() == name);
                (exists || applier.apply(&caches.jobs, job).await.is_some()).then_some(token)
            }
            _ => None,
        };
        let (primary, mut failover_pending) = self.elect_primary(db, &observed, applier).await;
        if !failover_pending {
            failover_pending = self.move_primary(db, &observed, statefulset.as_ref(), &primary, applier).await;
        }
        // Instance managers upgraded in place, never during a failover or switchover.
        let managers =
            upgrade::managers(&observed.pods, &self.ctx.settings.instance_image, k8s_openapi::jiff::Timestamp::now())
                .ok();
        if let Some(pod) = managers.as_ref().and_then(|m| m.next.as_ref()).filter(|_| !failover_pending) {
            match upgrade::upgrade_container(&self.ctx.settings.instance_image) {
                Ok(container) => {
                    applier.add_ephemeral_container(pod, &container).await;
                }
                Err(error) => tracing::warn!(%error, "cannot build the instance manager's upgrade"),
            }
        }
        let lease_expires_in = self
            .lease_unrenewed(db, &primary, &observed.pods)
            .map(|unrenewed| LEASE_EXPIRES_AFTER.saturating_sub(unrenewed));
        let PrimaryState { last: failover, blocked: failover_blocked, chosen, chosen_uid, synchronous_recheck, .. } =
            self.state(db);
        let asynchronous = self.asynchronous(db);
        Observed {
            credentials,
            replication,
            superuser,
            ca,
            server_tls,
            certificate_renewal_in: desired.certificate_renewal_in,
            statefulset,
            backups_claim,
            backup_cron_job,
            // None while a re-created database elects its primary.
            primary_uid: chosen_uid.filter(|_| chosen.as_deref() == Some(primary.as_str())),
            primary: Some(primary).filter(|primary| !primary.is_empty()),
            failover_pending,
            failover,
            failover_blocked,
            asynchronous,
            synchronous_recheck,
            replica_rebuild,
            lease_expires_in,
            restart_pending,
            managers,
            backup_request,
            ..observed
        }
    }

    fn status(db: &MyDatabase, observed: &Observed, outcome: &Outcome) -> MyDatabaseStatus {
        status::compute(db, observed, outcome, &crate::runtime::status::now())
    }

    /// While a failover waits for positions, look again soon (answers also arrive as pod events).
    /// ... and when the primary's lease would expire (renewals arrive as pod events),
    /// and when the server certificate is due for renewal. A user's certificate Secret is not
    /// watched: looked at again soon while it is not usable, and now and then for a new CA.
    fn recheck(db: &MyDatabase, observed: &Observed) -> Option<Duration> {
        let lease = observed.lease_expires_in.map(|left| left + Duration::from_millis(100));
        let renewal = observed.certificate_renewal_in.map(|left| left + Duration::from_secs(1));
        let user_tls =
            db.spec.tls.as_ref().map(|_| match tls::user_certificate(db, observed.user_server_tls.as_ref()) {
                Ok(_) => USER_CERTIFICATE_RECHECK,
                Err(_) => USER_CERTIFICATE_WAIT,
            });
        let pending = observed.failover_pending.then_some(Duration::from_millis(250));
        pending.into_iter().chain(lease).chain(renewal).chain(user_tls).chain(observed.synchronous_recheck).min()
    }

    fn current_status(db: &MyDatabase) -> Option<&MyDatabaseStatus> {
        db.status.as_ref()
    }

    /// Logs phase changes; publishes BackupFailed once per failed Job.
    async fn announce(&self, db: &MyDatabase, new: &MyDatabaseStatus, _outcome: &Outcome) {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let finished_at = new.last_backup_time.as_ref().map(|t| t.0.as_second());
        self.ctx.metrics.record_backup(&namespace, &name, finished_at, new.last_backup_size_bytes);
        if db.status.as_ref().and_then(|s| s.phase) != new.phase {
            tracing::info!(namespace, name, phase = ?new.phase, ready = new.ready_replicas, "MyDatabase phase changed");
        }
        let failed_backup = |status: Option<&MyDatabaseStatus>| {
            status?
                .conditions
                .iter()
                .find(|c| c.type_ == "LastBackupSucceeded" && c.status == "False")
                .map(|c| c.message.clone())
        };
        if let Some(message) = failed_backup(Some(new))
            && failed_backup(db.status.as_ref()).as_ref() != Some(&message)
        {
            tracing::warn!(namespace, name, "{message}");
            self.ctx.event(&db.object_ref(&()), EventType::Warning, "BackupFailed", "Backup", message).await;
        }
    }

    async fn clean_up(&self, db: &MyDatabase, observed: &Observed, applier: &Applier<'_>) {
        self.primaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&key(db));
        self.ctx.metrics.forget_database(&db.namespace().unwrap_or_default(), &db.name_any());
        deletion::clean_up(db, observed, &self.caches, &self.ctx, applier).await;
    }
}

impl MyDatabaseReconciler {
    /// The StatefulSet with the instance manager from `manager_image`, keeping
    /// the primary's pod while a scale-down waits for its handover.
    fn statefulset(
        &self,
        db: &MyDatabase,
        pods: &[Pod],
        manager_image: &str,
        scripts_hash: &str,
    ) -> Result<StatefulSet> {
        let settings = Settings { instance_image: manager_image.to_string(), ..self.ctx.settings.clone() };
        let mut statefulset = statefulset::build_with_scripts(db, &settings, scripts_hash)?;
        let status_primary = db.status.as_ref().and_then(|s| s.current_primary.clone());
        let primary = self.state(db).chosen.or(status_primary);
        let named = primary
            .as_ref()
            .and_then(|primary| pods.iter().find(|p| p.name_any() == *primary))
            .and_then(instances::report)
            .and_then(|report| report.synchronous_standby_names);
        let keep = drain::instances_to_keep(db.spec.replicas.max(0) as u32, primary.as_deref(), named.as_deref(), pods);
        if let Some(spec) = statefulset.spec.as_mut() {
            spec.replicas = Some(keep as i32);
        }
        Ok(statefulset)
    }

    /// A StatefulSet's claim templates cannot change, so growing storage
    /// means: expand each data PVC, then delete the StatefulSet without its
    /// pods (orphan); the next reconcile creates it with the new template.
    async fn grow_storage(&self, db: &MyDatabase, observed: &Observed, from: &str, applier: &Applier<'_>) {
        let patch = json!({"spec": {"resources": {"requests": {"storage": db.spec.storage}}}});
        for claim in &observed.data_claims {
            applier.merge_patch::<PersistentVolumeClaim>(&claim.name_any(), &patch, "expand").await;
        }
        if !applier.failures().is_empty() {
            return;
        }
        let note = format!(
            "storage {from} → {}: expanded the data PVCs; recreating the StatefulSet (pods keep running)",
            db.spec.storage
        );
        self.recreate_statefulset(db, observed, "StorageExpanding", note, applier).await;
    }

    /// Deletes the StatefulSet without its pods (orphan): the next reconcile
    /// creates it anew, with what could not be updated, and it adopts them.
    async fn recreate_statefulset(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        reason: &str,
        note: String,
        applier: &Applier<'_>,
    ) {
        let Some(existing) = &observed.statefulset else { return };
        // The uid precondition keeps a stale cache from deleting a StatefulSet already recreated.
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: existing.uid(), resource_version: None }),
            ..DeleteParams::orphan()
        };
        if applier.delete::<StatefulSet>(&existing.name_any(), &params).await {
            tracing::info!(namespace = %db.namespace().unwrap_or_default(), name = %db.name_any(), "{note}");
            self.ctx.event(&db.object_ref(&()), EventType::Normal, reason, "Recreate", note).await;
            applier.wait(format!("StatefulSet {} to be recreated with its new template", existing.name_any()));
        }
    }
}

fn uid_of(pods: &[Pod], name: &str) -> Option<String> {
    pods.iter().find(|p| p.name_any() == name).and_then(|p| p.metadata.uid.clone())
}

fn key(db: &MyDatabase) -> String {
    format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any())
}

impl MyDatabaseReconciler {
    fn state(&self, db: &MyDatabase) -> PrimaryState {
        self.primaries.lock().unwrap_or_else(|p| p.into_inner()).get(&key(db)).cloned().unwrap_or_default()
    }

    fn update_state(&self, db: &MyDatabase, change: impl FnOnce(&mut PrimaryState)) {
        change(self.primaries.lock().unwrap_or_else(|p| p.into_inner()).entry(key(db)).or_default());
    }

    /// How long the lease of `primary` has not been seen renewed, if its
    /// manager holds one (managers on fake nodes, or from before leases, do not).
    fn lease_unrenewed(&self, db: &MyDatabase, primary: &str, pods: &[Pod]) -> Option<Duration> {
        let pod = pods.iter().find(|p| p.name_any() == primary)?;
        let count = pod.annotations().get(LEASE)?;
        let mut unrenewed = Duration::ZERO;
        self.update_state(db, |state| match &state.lease_seen {
            Some((pod, seen, at)) if pod == primary && seen == count => unrenewed = at.elapsed(),
            _ => state.lease_seen = Some((primary.to_string(), count.clone(), Instant::now())),
        });
        Some(unrenewed)
    }

    /// Keeps the primary Keelson chose (see `failover`), replacing a lost
    /// one; returns it, and whether a failover or switchover waits for positions.
    async fn elect_primary(&self, db: &MyDatabase, observed: &Observed, applier: &Applier<'_>) -> (String, bool) {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let state = self.state(db);
        let status_primary =
            db.status.as_ref().and_then(|s| s.current_primary.as_deref()).filter(|primary| !primary.is_empty());
        // Recorded with its uid: written before any instance was told, so it outranks the labels.
        let status_uid =
            db.status.as_ref().and_then(|s| s.current_primary_uid.as_deref()).filter(|_| status_primary.is_some());
        // Re-created over Retained volumes: no primary on record, data from before. Elect one.
        let retained = retained_instances(db, observed);
        let bootstrap = state.chosen.is_none()
            && status_primary.is_none()
            && !retained.is_empty()
            && !observed
                .pods
                .iter()
                .any(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(services::PRIMARY));
        let recorded = match (&state.chosen, bootstrap, status_uid.and(status_primary)) {
            (Some(chosen), _, _) => chosen.clone(),
            (None, true, _) => String::new(),
            (None, false, Some(recorded)) => recorded.to_string(),
            (None, false, None) => failover::recorded_primary(&observed.pods, status_primary, &names::statefulset(db)),
        };
        // The pod chosen: known to this process, or recorded with the choice.
        let chosen_uid = match &state.chosen {
            Some(chosen) if *chosen == recorded => state.chosen_uid.as_deref(),
            Some(_) => None,
            None => status_uid.filter(|_| status_primary == Some(recorded.as_str())),
        };
        let lease_unrenewed = self.lease_unrenewed(db, &recorded, &observed.pods);
        let pending = state.pending.as_ref();
        let waited = pending.and_then(|p| p.held_at).is_some_and(|held| held.elapsed() >= POSITION_WAIT);
        let switchover = pending.and_then(|p| p.switchover.as_ref());
        let forced = db.annotations().contains_key(FORCE_FAILOVER_ANNOTATION);
        // Standbys that could have confirmed a commit: seen streaming from this primary, or whose
        // server ran (a report). One still cloning, or never started, confirmed nothing.
        let confirmed = |name: &String| {
            state.streamed.contains(name)
                || observed.pods.iter().any(|p| p.name_any() == *name && instances::report(p).is_some())
        };
        let standbys = match bootstrap {
            true => retained,
            false => synchronous::standbys(db, &recorded).into_iter().filter(confirmed).collect(),
        };
        // The primary on record acknowledged commits alone (status.asynchronous), and still may.
        let alone = self
            .asynchronous(db)
            .filter(|period| period.primary == recorded && db.spec.replication != ReplicationMode::Asynchronous);
        let situation = failover::Situation {
            asked: pending.map(|p| p.token.as_str()),
            stepping_down: switchover.map(|s| s.why.as_str()),
            prefer: switchover.map(|s| s.to.as_str()),
            waited_enough: waited,
            forced,
            chosen_uid,
            lease_expired: lease_unrenewed.is_some_and(|unrenewed| unrenewed >= LEASE_EXPIRES_AFTER),
            now: Some(k8s_openapi::jiff::Timestamp::now()),
            standbys: &standbys,
            asynchronous: alone.is_some(),
            data_from_before: alone.as_ref().is_some_and(|period| data_older_than(observed, &recorded, &period.since)),
            bootstrap,
        };
        match failover::decide(&recorded, &observed.pods, &situation) {
            Decision::Keep(primary) => {
                let serving = observed.pods.iter().find(|p| p.name_any() == primary).and_then(instances::report);
                let serving = serving.is_some_and(|r| r.role == Role::Primary && !r.unresponsive);
                let streaming: Vec<String> = observed
                    .pods
                    .iter()
                    .find(|p| p.name_any() == primary)
                    .and_then(instances::report)
                    .map(|r| r.replicas.into_iter().filter(|r| r.state == "streaming").map(|r| r.name).collect())
                    .unwrap_or_default();
                self.update_state(db, |state| {
                    if state.chosen.as_ref() != Some(&primary) {
                        state.streamed.clear();
                    }
                    state.streamed.extend(streaming);
                    state.chosen_uid = uid_of(&observed.pods, &primary).or(state.chosen_uid.take());
                    state.chosen = Some(primary.clone());
                    state.pending = None;
                    state.blocked = None;
                    state.told_alone = false;
                    // The first report of the promoted instance taking writes ends the downtime.
                    if let Some(record) = state.last.as_mut().filter(|r| r.to == primary && r.serving_at.is_none())
                        && serving
                    {
                        record.writes_down_ms = state.last_began.map(|began| began.elapsed().as_millis() as i64);
                        record.serving_at = Some(crate::runtime::status::now());
                    }
                });
                let asynchronous = self.durability(db, &primary, observed).await;
                label_pods(db, &observed.pods, &primary, asynchronous.as_ref(), applier).await;
                if forced {
                    // Nothing is blocked: an override left standing would apply to some later failover.
                    forget_annotation(db, FORCE_FAILOVER_ANNOTATION, applier).await;
                    let note =
                        format!("{FORCE_FAILOVER_ANNOTATION} removed: no failover was blocked ({primary} serves)");
                    self.ctx
                        .event(&db.object_ref(&()), EventType::Normal, "ForceFailoverIgnored", "Failover", note)
                        .await;
                }
                (primary, false)
            }
            Decision::AwaitStop { primary, why } => {
                // Handing over: the pod's SIGTERM stops PostgreSQL (fast), then the replicas are asked.
                tracing::debug!(namespace, name, primary, why, "primary leaving; no promotion until it has stopped");
                (primary, true)
            }
            Decision::AskPositions { lost, why, ask, token } => {
                if token.is_empty() {
                    tracing::warn!(namespace, name, primary = lost, why, replicas = ?ask, "primary lost; asking the replicas for their positions");
                    fence_unresponsive(db, &observed.pods, &lost, applier).await;
                    let mut pending = ask_positions(&lost, &why, &ask, None, applier).await;
                    if bootstrap {
                        // Nobody serves, nobody may stream: held from the start, each gives its position.
                        resend(&observed.pods, &ask, &pending.token, true, applier).await;
                        pending.held_at = Some(Instant::now());
                    }
                    // Cut off, it stopped taking writes before its lease expired.
                    if situation.lease_expired
                        && let Some(unrenewed) = lease_unrenewed
                        && let Some(since) = Instant::now().checked_sub(unrenewed)
                    {
                        pending.began = since;
                        pending.lost_at = Time(pending.lost_at.0 - unrenewed);
                    }
                    self.update_state(db, |state| state.pending = Some(pending));
                } else if pending.is_some_and(|p| p.held_at.is_some()) {
                    resend(&observed.pods, &ask, &token, true, applier).await;
                } else if let Some(pending) = pending.filter(|p| p.held_at.is_none()) {
                    resend(&observed.pods, &ask, &token, false, applier).await;
                    // Their streams ended (the old primary's end), or still run after the wait (it may
                    // still run): either way they hold now, so that their positions stay final.
                    let ended = ask.iter().all(|name| {
                        observed
                            .pods
                            .iter()
                            .find(|p| p.name_any() == *name)
                            .and_then(|p| failover::answer(p, &token))
                            .is_some_and(|answer| !answer.streaming)
                    });
                    if !ended && pending.asked_at.elapsed() < POSITION_WAIT {
                        return (recorded, true);
                    }
                    if !ended {
                        tracing::warn!(namespace, name, primary = lost, replicas = ?ask, "replicas still stream from the old primary; telling them to hold");
                    }
                    hold(&ask, &token, applier).await;
                    self.update_state(db, |state| {
                        if let Some(pending) = state.pending.as_mut() {
                            pending.held_at = Some(Instant::now());
                        }
                    });
                }
                (recorded, true)
            }
            Decision::Blocked { lost, why, waiting_for, ask } => {
                // A standby that comes back (or its replacement) is asked and held at once.
                if let Some(token) = pending.map(|p| p.token.clone()) {
                    resend(&observed.pods, &ask, &token, true, applier).await;
                }
                let note = match waiting_for == [lost.clone()] {
                    // status.asynchronous: the lost primary itself is waited for.
                    true => format!(
                        "primary {lost} lost ({why}); no replica promoted: {lost} acknowledged commits no standby \
                         confirmed (replication Preferred, status.asynchronous), so only it holds them. It takes the \
                         role again once its pod runs; annotate the MyDatabase {FORCE_FAILOVER_ANNOTATION}=true to \
                         promote the best replica, accepting that those commits are lost"
                    ),
                    false => format!(
                        "primary {lost} lost ({why}); no replica promoted: {} may hold the last acknowledged commits \
                         and gave no final position. It is promoted once they answer; annotate the MyDatabase \
                         {FORCE_FAILOVER_ANNOTATION}=true to promote the best of the others, accepting that those \
                         commits may be lost",
                        waiting_for.join(", ")
                    ),
                };
                // Waiting for the lost primary itself asks nobody: no failover is under way (a forced one
                // starts afresh, fencing and asking as any other).
                let alone = waiting_for == [lost.clone()];
                let told = match alone {
                    true => state.told_alone,
                    false => pending.is_some_and(|p| p.blocked_told),
                };
                if !told {
                    tracing::warn!(namespace, name, primary = lost, waiting_for = ?waiting_for, "failover blocked");
                    self.ctx
                        .event(&db.object_ref(&()), EventType::Warning, "FailoverBlocked", "Failover", note.clone())
                        .await;
                    self.update_state(db, |state| match state.pending.as_mut() {
                        Some(pending) if !alone => pending.blocked_told = true,
                        _ => state.told_alone = alone,
                    });
                }
                self.update_state(db, |state| state.blocked = Some(note));
                (recorded, true)
            }
            Decision::Promote(promotion) => {
                let lost_at = state.pending.as_ref().map(|p| p.lost_at.clone());
                let began = state.pending.as_ref().map(|p| p.began);
                let why = state.pending.as_ref().map_or(promotion.why.clone(), |p| p.why.clone());
                let positions: Vec<String> =
                    promotion.positions.iter().map(|(pod, lsn)| format!("{pod} at {lsn}")).collect();
                let (kind, event_type) = match switchover {
                    Some(_) => ("Switchover", EventType::Normal),
                    None if bootstrap => ("Election", EventType::Normal),
                    None => ("Failover", EventType::Warning),
                };
                let mut note = match bootstrap {
                    true => format!(
                        "election: {why}; promoted {}, the instance with the most WAL ({})",
                        promotion.to,
                        positions.join(", ")
                    ),
                    false => format!(
                        "{}: primary {} ({}); promoted {}, the replica that received the most WAL ({})",
                        kind.to_lowercase(),
                        promotion.from,
                        why,
                        promotion.to,
                        positions.join(", ")
                    ),
                };
                if forced && state.blocked.is_some() {
                    note.push_str(&format!(
                        "; forced by {FORCE_FAILOVER_ANNOTATION}: replicas that did not answer may have held \
                         acknowledged commits that are lost"
                    ));
                }
                if let Some(wanted) = switchover.map(|s| &s.to).filter(|to| **to != promotion.to) {
                    note.push_str(&format!("; {wanted} had received less"));
                }
                // On record before any instance is told: a restarted operator carries on from it.
                let uid = uid_of(&observed.pods, &promotion.to);
                if !self.record_primary(db, &promotion.to, uid.as_deref()).await {
                    return (recorded, true);
                }
                tracing::warn!(namespace, name, from = promotion.from, to = promotion.to, "{note}");
                label_pods(db, &observed.pods, &promotion.to, None, applier).await;
                self.ctx.event(&db.object_ref(&()), event_type, kind, "Promote", note).await;
                if switchover.is_some_and(|s| s.requested) {
                    forget_switchover_request(db, applier).await;
                }
                if forced {
                    forget_annotation(db, FORCE_FAILOVER_ANNOTATION, applier).await;
                }
                let record = FailoverRecord {
                    kind: kind.into(),
                    from: promotion.from,
                    to: promotion.to.clone(),
                    reason: why,
                    lost_at,
                    promoted_at: Some(crate::runtime::status::now()),
                    positions,
                    ..Default::default()
                };
                self.update_state(db, |state| {
                    state.streamed.clear();
                    state.chosen_uid = uid;
                    state.chosen = Some(promotion.to.clone());
                    state.pending = None;
                    state.blocked = None;
                    state.told_alone = false;
                    // The new primary names its standbys: what the old one acknowledged alone is given up (forced).
                    state.asynchronous = Some(None);
                    state.synchronous = synchronous::Watch::default();
                    state.last = Some(record);
                    state.last_began = began;
                });
                (promotion.to, false)
            }
            Decision::NoCandidate { lost, why } => {
                // Starting, or every replica is gone too: the pod on record keeps (or gets) the role.
                let starting = observed.pods.is_empty();
                if starting
                    || observed.pods.iter().any(|p| p.name_any() == lost && p.metadata.deletion_timestamp.is_none())
                {
                    tracing::debug!(namespace, name, primary = lost, why, "no replica to take over; the role stays");
                } else {
                    tracing::warn!(namespace, name, primary = lost, why, "primary lost and no replica can take over");
                }
                self.update_state(db, |state| {
                    state.chosen_uid = uid_of(&observed.pods, &lost);
                    state.chosen = Some(lost.clone());
                    state.pending = None;
                    state.blocked = None;
                });
                label_pods(db, &observed.pods, &lost, self.asynchronous(db).as_ref(), applier).await;
                (lost, false)
            }
        }
    }

    /// Moves the primary when asked to (the switchover annotation) or when a
    /// rollout needs it, and replaces outdated pods (see `rollout`). True when
    /// a switchover began.
    async fn move_primary(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        statefulset: Option<&StatefulSet>,
        primary: &str,
        applier: &Applier<'_>,
    ) -> bool {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        // The primary acknowledged commits alone: no move until a standby has them too.
        let alone = self.asynchronous(db).filter(|period| period.primary == primary).map(|period| {
            format!(
                "{primary} acknowledged commits no standby confirmed (status.asynchronous since {}); a switchover \
                 waits until a standby has caught up",
                period.since.0
            )
        });
        if let Some(target) = db.annotations().get(SWITCHOVER_ANNOTATION) {
            let why = format!("switchover to {target} requested");
            let standbys = synchronous::standbys(db, primary);
            let refusal = match [primary, target.as_str()].into_iter().find(|p| is_fenced(db.annotations(), p)) {
                Some(fenced) => Some(format!("{fenced} is fenced for maintenance; unfence it first")),
                None => failover::switchover_refusal(target, primary, &observed.pods, &standbys).or(alone.clone()),
            };
            match refusal {
                None => return self.switch_over(db, observed, primary, target, why, true, applier).await,
                Some(refusal) => {
                    let already = target == primary;
                    if !already {
                        tracing::warn!(namespace, name, target, "switchover refused: {refusal}");
                        let note = format!("switchover to {target} refused: {refusal}");
                        self.ctx
                            .event(&db.object_ref(&()), EventType::Warning, "SwitchoverRefused", "Switchover", note)
                            .await;
                    }
                    forget_switchover_request(db, applier).await;
                    return false;
                }
            }
        }
        if is_fenced(db.annotations(), primary) {
            // Stopped on purpose: no handover or rollout moves writes elsewhere meanwhile.
            applier.wait(format!("the primary {primary} to be unfenced"));
            return false;
        }
        // A drain or a scale-down is about to take the primary's pod: hand over first.
        let instances = db.spec.replicas.max(0) as u32;
        let cordoned = &self.caches.cordoned;
        if let Some(why) = drain::handover_reason(instances, primary, &observed.pods, cordoned) {
            if let Some(alone) = alone {
                applier.wait(format!("a standby to catch up before handing the primary over ({why}): {alone}"));
                return false;
            }
            let standbys = synchronous::standbys(db, primary);
            match drain::successor(instances, primary, &observed.pods, cordoned, &standbys) {
                Some(to) => return self.switch_over(db, observed, primary, &to, why, false, applier).await,
                None => {
                    applier.wait(format!("a streaming replica to hand the primary over to ({why})"));
                    return false;
                }
            }
        }
        let Some(statefulset) = statefulset else { return false };
        match rollout::next_step(statefulset, &observed.pods, primary) {
            Step::Done => false,
            Step::Wait(reason) => {
                tracing::debug!(namespace, name, "rollout waits for {reason}");
                false
            }
            Step::Replace(pod) => {
                let revision = statefulset.status.as_ref().and_then(|s| s.update_revision.clone()).unwrap_or_default();
                let note = format!("replacing {pod} with the new pod template (revision {revision})");
                tracing::info!(namespace, name, pod, "{note}");
                if applier.delete::<Pod>(&pod, &DeleteParams::default()).await {
                    self.ctx.event(&db.object_ref(&()), EventType::Normal, "RollingUpdate", "Replace", note).await;
                }
                false
            }
            Step::SwitchoverTo(_) if alone.is_some() => {
                applier.wait(format!(
                    "a standby to catch up before the primary's pod is replaced: {}",
                    alone.unwrap_or_default()
                ));
                false
            }
            Step::SwitchoverTo(target) => {
                let why = "rolling update: the primary's pod is the last outdated".to_string();
                self.switch_over(db, observed, primary, &target, why, false, applier).await
            }
        }
    }

    /// Begins a switchover: the primary is stepped down first (it leaves
    /// `-rw` and shuts down cleanly, its replicas receive all it wrote), and
    /// the replicas are asked for their positions; `elect_primary` promotes.
    #[allow(clippy::too_many_arguments)]
    async fn switch_over(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        primary: &str,
        target: &str,
        why: String,
        requested: bool,
        applier: &Applier<'_>,
    ) -> bool {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        tracing::info!(namespace, name, from = primary, to = target, why, "switchover: stepping the primary down");
        let patch = json!({"metadata": {"labels": {names::ROLE_LABEL: services::REPLICA}}});
        if !applier.merge_patch::<Pod>(primary, &patch, "step-down").await {
            return false;
        }
        // Every replica the promotion will wait for, streaming or not (one not asked would cost the whole wait).
        let mut replicas: Vec<String> =
            failover::candidates(primary, &observed.pods).iter().map(|p| p.name_any()).collect();
        for standby in synchronous::standbys(db, primary) {
            if !replicas.contains(&standby) && observed.pods.iter().any(|p| p.name_any() == standby) {
                replicas.push(standby);
            }
        }
        let switchover = Switchover { to: target.to_string(), why, requested };
        let why = switchover.why.clone();
        let pending = ask_positions(primary, &why, &replicas, Some(switchover), applier).await;
        self.update_state(db, |state| state.pending = Some(pending));
        true
    }
}

impl MyDatabaseReconciler {
    /// Writes the new primary (and its pod's uid) to `status` before any
    /// instance is told: the one record a restarted operator, and anyone
    /// reading the MyDatabase, goes by. False when the write failed (the
    /// promotion waits for the next pass).
    async fn record_primary(&self, db: &MyDatabase, primary: &str, uid: Option<&str>) -> bool {
        let patch = json!({"status": {"currentPrimary": primary, "currentPrimaryUid": uid}});
        self.patch_status(db, &patch).await
    }

    /// A record on the MyDatabase's status that must land before anyone acts
    /// on it (a merge patch of those fields alone). False when it failed.
    async fn patch_status(&self, db: &MyDatabase, patch: &serde_json::Value) -> bool {
        let api: kube::Api<MyDatabase> =
            kube::Api::namespaced(self.ctx.client.clone(), &db.namespace().unwrap_or_default());
        let result =
            api.patch_status(&db.name_any(), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch)).await;
        let labels = crate::runtime::metrics::ControllerLabels { controller: CONTROLLER };
        self.ctx.metrics.status_writes.get_or_create(&labels).inc();
        if let Err(error) = result {
            tracing::warn!(namespace = %db.namespace().unwrap_or_default(), name = %db.name_any(), %patch, %error, "could not record on status; acting on it waits");
            return false;
        }
        true
    }
}

impl MyDatabaseReconciler {
    /// `status.asynchronous` as it stands: this process's last decision, else status.
    fn asynchronous(&self, db: &MyDatabase) -> Option<AsynchronousPeriod> {
        match self.state(db).asynchronous {
            Some(decided) => decided,
            None => db.status.as_ref().and_then(|s| s.asynchronous.clone()),
        }
    }

    /// With `replication: Preferred`, lets the serving `primary` stop waiting
    /// for standbys once none has streamed for a while, after recording
    /// `status.asynchronous` (a failover reads it), and removes the record once
    /// a standby has caught up (see `synchronous`). Returns the record in force.
    async fn durability(&self, db: &MyDatabase, primary: &str, observed: &Observed) -> Option<AsynchronousPeriod> {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let recorded = self.asynchronous(db);
        let report = observed.pods.iter().find(|p| p.name_any() == primary).and_then(instances::report);
        let mut watch = self.state(db).synchronous;
        let (change, again) =
            synchronous::step(db, primary, recorded.as_ref(), report.as_ref(), &mut watch, Instant::now());
        let recorded = match change {
            synchronous::Change::Nothing => recorded,
            synchronous::Change::StopWaiting => {
                let period = AsynchronousPeriod { primary: primary.to_string(), since: crate::runtime::status::now() };
                let patch = json!({"status": {"asynchronous": period}});
                match self.patch_status(db, &patch).await {
                    true => {
                        let note = format!(
                            "no standby has streamed from {primary} for {}s: it acknowledges commits alone until one \
                             has caught up (replication Preferred); a lost primary is not failed over meanwhile",
                            synchronous::PREFERRED_WAIT.as_secs()
                        );
                        tracing::warn!(namespace, name, primary, "{note}");
                        self.ctx
                            .event(
                                &db.object_ref(&()),
                                EventType::Warning,
                                "ReplicationAsynchronous",
                                "Replicate",
                                note,
                            )
                            .await;
                        Some(period)
                    }
                    false => recorded,
                }
            }
            synchronous::Change::Confirmed => {
                if let Some(period) = recorded.as_ref().filter(|period| period.primary == primary) {
                    let note = format!(
                        "a standby of {primary} has every commit again: synchronous, failover automatic (asynchronous \
                         since {})",
                        period.since.0
                    );
                    tracing::info!(namespace, name, primary, "{note}");
                    self.ctx
                        .event(&db.object_ref(&()), EventType::Normal, "ReplicationSynchronous", "Replicate", note)
                        .await;
                }
                None
            }
        };
        self.update_state(db, |state| {
            state.synchronous = watch;
            state.synchronous_recheck = again;
            state.asynchronous = Some(recorded.clone());
        });
        recorded
    }
}

/// Whether `pod`'s data volume was made before `at`: a pod coming back on it has what the
/// instance wrote then (a newer one, or none, is empty).
fn data_older_than(observed: &Observed, pod: &str, at: &Time) -> bool {
    let claim = format!("data-{pod}");
    observed
        .data_claims
        .iter()
        .filter(|c| c.name_any() == claim && c.metadata.deletion_timestamp.is_none())
        .any(|c| c.metadata.creation_timestamp.as_ref().is_some_and(|created| created.0 < at.0))
}

/// The instances whose data volumes are older than `db` itself: it was
/// re-created over volumes a former MyDatabase of that name retained.
fn retained_instances(db: &MyDatabase, observed: &Observed) -> Vec<String> {
    let Some(created) = db.metadata.creation_timestamp.as_ref() else { return Vec::new() };
    let instances = names::instance_pods(db);
    let mut retained: Vec<String> = observed
        .data_claims
        .iter()
        .filter(|claim| claim.metadata.creation_timestamp.as_ref().is_some_and(|at| at.0 < created.0))
        .filter_map(|claim| claim.name_any().strip_prefix("data-").map(str::to_string))
        .filter(|pod| instances.contains(pod))
        .collect();
    retained.sort();
    retained
}

/// A primary that stopped answering may answer again (a frozen process, a
/// stalled disk): before another is promoted, its pod is deleted (killed by
/// the kubelet after a second) and relabelled, so it can never take writes
/// beside the new primary. Its replacement rejoins as a replica.
async fn fence_unresponsive(db: &MyDatabase, pods: &[Pod], lost: &str, applier: &Applier<'_>) {
    let Some(pod) = pods.iter().find(|p| p.name_any() == lost && p.metadata.deletion_timestamp.is_none()) else {
        return;
    };
    if !instances::report(pod).is_some_and(|r| r.unresponsive) {
        return;
    }
    let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
    tracing::warn!(namespace, name, pod = lost, "fencing the unresponsive primary: deleting its pod");
    let patch = json!({"metadata": {"labels": {names::ROLE_LABEL: services::REPLICA}}});
    applier.merge_patch::<Pod>(lost, &patch, "fence").await;
    applier.delete::<Pod>(lost, &DeleteParams { grace_period_seconds: Some(1), ..Default::default() }).await;
}

/// Asks `replicas` for their positions now (a request their managers answer
/// at once). They are told to hold (see `hold`) only once their streams have
/// ended, or after the wait: a deleted pod's processes outlive its object for
/// a moment, and holding (then promoting) before would leave two primaries
/// taking connections. Only a held replica's answer counts (`failover::decide`).
async fn ask_positions(
    lost: &str,
    why: &str,
    replicas: &[String],
    switchover: Option<Switchover>,
    applier: &Applier<'_>,
) -> Pending {
    let token = format!("{lost}@{}", crate::runtime::status::now().0.as_millisecond());
    let patch = json!({"metadata": {"annotations": {POSITION_REQUEST: token}}});
    for pod in replicas {
        applier.merge_patch::<Pod>(pod, &patch, "ask-position").await;
    }
    let asked_at = Instant::now();
    Pending {
        token,
        asked_at,
        began: asked_at,
        lost_at: crate::runtime::status::now(),
        why: why.into(),
        switchover,
        held_at: None,
        blocked_told: false,
    }
}

/// Tells `replicas` to hold: stop streaming, so that their positions are
/// final and an old primary that still runs (hung, cut off) can have no more
/// commits confirmed by them.
async fn hold(replicas: &[String], token: &str, applier: &Applier<'_>) {
    let patch = json!({"metadata": {"annotations": {HOLD_STREAMING: token}}});
    for pod in replicas {
        applier.merge_patch::<Pod>(pod, &patch, "hold").await;
    }
}

/// Sends the position request (and the hold, once given) again to the pods
/// in `ask` that do not carry it: a patch that failed, or a pod that appeared
/// since (a standby's replacement). A pod without a role yet is made a
/// replica, so that its PostgreSQL starts (held) and answers.
async fn resend(pods: &[Pod], ask: &[String], token: &str, held: bool, applier: &Applier<'_>) {
    for pod in pods.iter().filter(|p| ask.contains(&p.name_any())) {
        let carries = |annotation: &str| pod.annotations().get(annotation).map(String::as_str) == Some(token);
        if carries(POSITION_REQUEST) && (!held || carries(HOLD_STREAMING)) {
            continue;
        }
        let mut patch = json!({"metadata": {"annotations": {POSITION_REQUEST: token}}});
        if held {
            patch["metadata"]["annotations"][HOLD_STREAMING] = json!(token);
        }
        if !pod.labels().contains_key(names::ROLE_LABEL) {
            patch["metadata"]["labels"] = json!({names::ROLE_LABEL: services::REPLICA});
        }
        applier.merge_patch::<Pod>(&pod.name_any(), &patch, "ask-position").await;
    }
}

/// Removes the switchover annotation: the request is done, or refused (an Event says why).
async fn forget_switchover_request(db: &MyDatabase, applier: &Applier<'_>) {
    forget_annotation(db, SWITCHOVER_ANNOTATION, applier).await;
}

async fn forget_annotation(db: &MyDatabase, annotation: &str, applier: &Applier<'_>) {
    let patch = json!({"metadata": {"annotations": {annotation: null}}});
    applier.merge_patch::<MyDatabase>(&db.name_any(), &patch, "annotation-done").await;
}

/// Puts each pod's role label (which `-rw` and `-ro` select, and which its
/// instance manager hands to PostgreSQL), synchronous standbys and upstream
/// (the primary's pod address) in place, and lifts a failover's hold in the
/// same write as the new upstream. A pod that loses the primary role is
/// relabelled first: it leaves `-rw` before another pod is announced there.
async fn label_pods(
    db: &MyDatabase,
    pods: &[Pod],
    primary: &str,
    asynchronous: Option<&AsynchronousPeriod>,
    applier: &Applier<'_>,
) {
    let wanted = |pod: &Pod| if pod.name_any() == primary { services::PRIMARY } else { services::REPLICA };
    let primary_pod = pods.iter().find(|p| p.name_any() == primary);
    let upstream = primary_pod.and_then(|p| p.status.as_ref()?.pod_ip.clone());
    let sslmode = primary_pod.map_or(statefulset::UPSTREAM_SSLMODE, statefulset::upstream_sslmode);
    // The pod losing the role first, then the new primary, then the others.
    let stepping_down = |pod: &Pod| pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(services::PRIMARY);
    let mut ordered: Vec<&Pod> = pods.iter().collect();
    ordered.sort_by_key(|pod| match wanted(pod) {
        services::PRIMARY => 1,
        _ if stepping_down(pod) => 0,
        _ => 2,
    });
    for pod in ordered {
        let role = wanted(pod);
        // Nothing further until the pod losing the role has lost it and the new primary has it:
        // else `-rw` could select two pods.
        let must_land = role == services::PRIMARY || stepping_down(pod);
        let Some(patch) = role_patch(db, pod, role, upstream.as_deref(), sslmode, asynchronous) else { continue };
        if applier.merge_patch::<Pod>(&pod.name_any(), &patch, "label").await {
            tracing::info!(namespace = ?pod.namespace(), pod = %pod.name_any(), role, "labelled pod role");
        } else if must_land {
            return;
        }
    }
}

/// The fence order on each pod as `FENCED_INSTANCES_ANNOTATION` says, in every
/// pass whatever the failover's state: an unfence must reach a replica that a
/// blocked failover waits to hear from.
async fn sync_fences(db: &MyDatabase, pods: &[Pod], applier: &Applier<'_>) {
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let Some(patch) = fence_patch(db, pod) else { continue };
        if applier.merge_patch::<Pod>(&pod.name_any(), &patch, "fence").await {
            tracing::info!(namespace = ?pod.namespace(), pod = %pod.name_any(), fenced = !patch["metadata"]["annotations"][FENCE].is_null(), "fence order");
        }
    }
}

/// The patch that makes `pod`'s fence order what `db` asks, if it is not.
fn fence_patch(db: &MyDatabase, pod: &Pod) -> Option<serde_json::Value> {
    let wanted = is_fenced(db.annotations(), &pod.name_any()).then_some(FENCE_REASON);
    (pod.annotations().get(FENCE).map(String::as_str) != wanted)
        .then(|| json!({"metadata": {"annotations": {FENCE: wanted}}}))
}

/// What `pod` needs to take `role` under the primary at `upstream`, if
/// anything. A replica's hold is lifted only with an upstream to stream
/// from: the new primary's address, never the old one's.
fn role_patch(
    db: &MyDatabase,
    pod: &Pod,
    role: &str,
    upstream: Option<&str>,
    sslmode: &str,
    asynchronous: Option<&AsynchronousPeriod>,
) -> Option<serde_json::Value> {
    let streaming = synchronous::streaming(instances::report(pod).as_ref());
    let synchronous = synchronous::standby_names(db, &pod.name_any(), asynchronous, &streaming);
    let annotations = pod.annotations();
    let (wanted_upstream, lift_hold) = match role {
        services::PRIMARY => (None, true),
        _ => (upstream, upstream.is_some()),
    };
    let upstream_ok = match (role, wanted_upstream) {
        (services::PRIMARY, _) => !annotations.contains_key(UPSTREAM),
        (_, Some(wanted)) => {
            annotations.get(UPSTREAM).map(String::as_str) == Some(wanted)
                && annotations.get(UPSTREAM_SSLMODE).map(String::as_str) == Some(sslmode)
        }
        (_, None) => true,
    };
    if pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(role)
        && annotations.get(SYNCHRONOUS_STANDBYS) == Some(&synchronous)
        && (!lift_hold || !annotations.contains_key(HOLD_STREAMING))
        && upstream_ok
    {
        return None;
    }
    let mut patch = json!({"metadata": {
        "labels": {names::ROLE_LABEL: role},
        "annotations": {SYNCHRONOUS_STANDBYS: synchronous}}});
    if lift_hold {
        patch["metadata"]["annotations"][HOLD_STREAMING] = serde_json::Value::Null;
    }
    match (role, wanted_upstream) {
        (services::PRIMARY, _) => {
            patch["metadata"]["annotations"][UPSTREAM] = serde_json::Value::Null;
            patch["metadata"]["annotations"][UPSTREAM_SSLMODE] = serde_json::Value::Null;
        }
        (_, Some(wanted)) => {
            patch["metadata"]["annotations"][UPSTREAM] = json!(wanted);
            patch["metadata"]["annotations"][UPSTREAM_SSLMODE] = json!(sslmode);
        }
        (_, None) => {}
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::runtime::Action;
    use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
    use serde_json::Value;

    use super::*;
    use crate::api::mydatabase::{DeletionPolicy, ReplicationMode};
    use crate::mydatabase::credentials::Passwords;
    use crate::mydatabase::tests::sample;
    use crate::runtime::drift::stamp_desired_hash;
    use crate::runtime::fake_api::{FakeApi, cache};
    use crate::runtime::outcome::{RESYNC, WAIT_POLL};
    use crate::runtime::{Metrics, pipeline};

    /// The tutorial's MyDatabase once its finalizer is in place.
    fn held() -> MyDatabase {
        let mut db = sample();
        db.metadata.finalizers = Some(vec![FINALIZER.into()]);
        db
    }

    fn deleted(policy: DeletionPolicy) -> MyDatabase {
        let mut db = held();
        db.spec.deletion_policy = policy;
        db.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        db
    }

    #[derive(Default)]
    struct Cached {
        statefulsets: Vec<StatefulSet>,
        secrets: Vec<Secret>,
        cron_jobs: Vec<CronJob>,
        disruption_budgets: Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
        jobs: Vec<Job>,
        claims: Vec<PersistentVolumeClaim>,
        pods: Vec<Pod>,
    }

    fn reconciler(client: kube::Client, cached: Cached) -> Arc<MyDatabaseReconciler> {
        let mut caches = Caches::empty();
        caches.statefulsets = cache(cached.statefulsets);
        caches.secrets = cache(cached.secrets);
        caches.cron_jobs = cache(cached.cron_jobs);
        caches.disruption_budgets = cache(cached.disruption_budgets);
        caches.jobs = cache(cached.jobs);
        caches.claims = cache(cached.claims);
        caches.pods = cache(cached.pods);
        Arc::new(MyDatabaseReconciler {
            ctx: Context::new(client, Arc::new(Metrics::default()), crate::runtime::Settings::default()),
            caches,
            primaries: Default::default(),
        })
    }

    fn stamped<K: kube::Resource + serde::Serialize>(mut object: K) -> K {
        stamp_desired_hash(&mut object).expect("stamps");
        object
    }

    fn kept_passwords() -> Passwords {
        Passwords { app: "kept-app-password".into(), replication: "kept-replication".into() }
    }

    /// One CA and server certificate for every test (generating keys is slow in a debug build).
    fn kept_certificates() -> &'static tls::Certificates {
        static KEPT: std::sync::OnceLock<tls::Certificates> = std::sync::OnceLock::new();
        KEPT.get_or_init(|| tls::certificates(&sample(), None, None, chrono::Utc::now()).expect("generates"))
    }

    fn credentials(db: &MyDatabase) -> Secret {
        stamped(credentials::build(db, &kept_passwords(), &kept_certificates().ca_cert, true).expect("builds"))
    }

    fn ca(db: &MyDatabase) -> Secret {
        stamped(tls::build_ca(db, kept_certificates()))
    }

    fn server_tls(db: &MyDatabase) -> Secret {
        stamped(tls::build_server(db, kept_certificates()).expect("builds"))
    }

    fn replication(db: &MyDatabase) -> Secret {
        stamped(credentials::build_replication(db, &kept_passwords(), None))
    }

    fn data_claim(ordinal: u32) -> PersistentVolumeClaim {
        let db = sample();
        let mut claim = backup::volume_claim(&db);
        claim.metadata.name = Some(format!("data-production-db-{ordinal}"));
        claim.metadata.labels = Some(names::labels(&db, "database"));
        claim
    }

    fn finished_job(name: &str, condition: &str) -> Job {
        let db = sample();
        let mut job = Job { metadata: names::unowned_meta(&db, name.into(), "backup"), ..Default::default() };
        let time = Some(crate::runtime::status::now());
        job.status = Some(JobStatus {
            completion_time: (condition == "Complete").then(|| time.clone()).flatten(),
            conditions: Some(vec![JobCondition {
                type_: condition.into(),
                status: "True".into(),
                last_transition_time: time,
                ..Default::default()
            }]),
            ..Default::default()
        });
        job
    }

    fn condition(status: &Value, type_: &str) -> Value {
        let conditions = status["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == type_).unwrap_or(Value::Null)
    }

    fn finalizer_removed(api: &FakeApi) -> bool {
        api.requests().iter().any(|r| {
            r.content_type.starts_with("application/json-patch")
                && r.body.to_string().contains("\"remove\"")
                && r.path.ends_with("/mydatabases/production-db")
        })
    }

    fn deletes(api: &FakeApi) -> Vec<String> {
        api.requests().into_iter().filter(|r| r.method == "DELETE").map(|r| r.target().to_string()).collect()
    }

    #[test]
    fn a_hold_is_lifted_only_with_the_new_primarys_address_to_stream_from() {
        let db = sample();
        let mut held = Pod::default();
        held.metadata.name = Some("production-db-1".into());
        held.metadata.labels = Some([(names::ROLE_LABEL.to_string(), services::REPLICA.to_string())].into());
        held.metadata.annotations = Some(
            [
                (HOLD_STREAMING.to_string(), "t1".to_string()),
                (UPSTREAM.to_string(), "10.0.0.1".to_string()),
                (SYNCHRONOUS_STANDBYS.to_string(), synchronous::standby_names(&db, "production-db-1", None, &[])),
            ]
            .into(),
        );
        // The new primary has no address yet: the hold stays, the old address too.
        assert_eq!(role_patch(&db, &held, services::REPLICA, None, "verify-ca", None), None);
        let patch = role_patch(&db, &held, services::REPLICA, Some("10.0.0.2"), "verify-ca", None).expect("a patch");
        let annotations = &patch["metadata"]["annotations"];
        assert_eq!(
            (annotations[HOLD_STREAMING].clone(), annotations[UPSTREAM].clone(), annotations[UPSTREAM_SSLMODE].clone()),
            (Value::Null, json!("10.0.0.2"), json!("verify-ca"))
        );
        assert!(annotations.as_object().is_some_and(|a| a.contains_key(HOLD_STREAMING)), "the hold is removed");
        // Chosen as the primary: no upstream, no hold.
        let patch = role_patch(&db, &held, services::PRIMARY, Some("10.0.0.2"), "verify-ca", None).expect("a patch");
        assert_eq!(patch["metadata"]["labels"][names::ROLE_LABEL], json!("primary"));
        assert_eq!(patch["metadata"]["annotations"][UPSTREAM], Value::Null);
    }

    #[test]
    fn a_fenced_instance_is_told_so_on_its_pod_and_unfenced_by_removing_it() {
        let mut db = sample();
        let mut pod = Pod::default();
        pod.metadata.name = Some("production-db-1".into());
        assert_eq!(fence_patch(&db, &pod), None, "nothing to do");
        db.metadata.annotations = Some(
            [(
                crate::api::mydatabase::FENCED_INSTANCES_ANNOTATION.to_string(),
                "production-db-2, production-db-1".into(),
            )]
            .into(),
        );
        let patch = fence_patch(&db, &pod).expect("the fence order");
        assert_eq!(patch["metadata"]["annotations"][FENCE], json!(FENCE_REASON));
        pod.metadata.annotations = Some([(FENCE.to_string(), FENCE_REASON.to_string())].into());
        assert_eq!(fence_patch(&db, &pod), None, "told once");
        db.metadata.annotations = None;
        let patch = fence_patch(&db, &pod).expect("the order goes");
        let annotations = patch["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
        assert_eq!(annotations.get(FENCE), Some(&Value::Null), "removed by the merge patch");
    }

    /// The StatefulSet of `db` as the cache holds it, and `pods` (named, with
    /// reports) made its own, each with the uid `uid-<name>`.
    fn instances(db: &MyDatabase, pods: Vec<Pod>) -> Cached {
        let mut statefulset = stamped(statefulset::build(db, &crate::runtime::Settings::default()).expect("builds"));
        statefulset.metadata.uid = Some("statefulset-uid".into());
        let pods = pods
            .into_iter()
            .map(|mut pod| {
                pod.metadata.namespace = db.namespace();
                pod.metadata.uid = Some(format!("uid-{}", pod.name_any()));
                let mut labels = pod.metadata.labels.take().unwrap_or_default();
                labels.extend(names::pod_selector(db));
                pod.metadata.labels = Some(labels);
                pod.metadata.owner_references =
                    Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        kind: "StatefulSet".into(),
                        name: names::statefulset(db),
                        uid: "statefulset-uid".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]);
                pod
            })
            .collect();
        Cached { statefulsets: vec![statefulset], secrets: vec![credentials(db)], pods, ..Default::default() }
    }

    /// Which request first sent `pod` its primary role label, by position.
    fn labelled_primary_at(api: &FakeApi, pod: &str) -> Option<usize> {
        api.requests().iter().position(|r| {
            r.method == "PATCH"
                && r.path.ends_with(&format!("/pods/{pod}"))
                && r.body["metadata"]["labels"][names::ROLE_LABEL] == "primary"
        })
    }

    #[tokio::test]
    async fn a_promotion_is_recorded_on_the_mydatabase_before_any_pod_is_told() {
        use crate::mydatabase::failover::tests::pod;
        let db = held();
        // production-db-0 is gone; both standbys hold and answered: production-db-1 received most.
        let pods = vec![
            pod("production-db-1", Role::Replica, "0/700", Some("t1")),
            pod("production-db-2", Role::Replica, "0/500", Some("t1")),
        ];
        let pending = |reconciler: &MyDatabaseReconciler| {
            reconciler.update_state(&db, |state| {
                state.chosen = Some("production-db-0".into());
                state.chosen_uid = Some("uid-production-db-0".into());
                state.pending = Some(Pending { held_at: Some(Instant::now()), ..ask_pending("production-db-0", "t1") });
            })
        };
        let (api, client) = FakeApi::new(&db);
        let first = reconciler(client, instances(&db, pods.clone()));
        pending(&first);
        pipeline::reconcile(Arc::new(db.clone()), first).await.expect("reconciles");
        let requests = api.requests();
        let recorded = requests.iter().position(|r| {
            r.path.ends_with("/mydatabases/production-db/status")
                && r.body["status"]["currentPrimary"] == "production-db-1"
                && r.body["status"]["currentPrimaryUid"] == "uid-production-db-1"
        });
        let labelled = labelled_primary_at(&api, "production-db-1");
        assert!(
            recorded.is_some() && labelled.is_some() && recorded < labelled,
            "recorded {recorded:?}, labelled {labelled:?}"
        );

        // The record refused: no pod is told, the failover stays pending.
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/mydatabases/production-db/status", 500, "InternalError", "etcd is away");
        let reconciler = reconciler(client, instances(&db, pods));
        pending(&reconciler);
        pipeline::reconcile(Arc::new(db.clone()), reconciler.clone()).await.ok();
        assert_eq!(labelled_primary_at(&api, "production-db-1"), None);
        assert!(reconciler.state(&db).pending.is_some(), "the failover waits for its record");
    }

    #[tokio::test]
    async fn preferred_records_going_on_alone_before_the_primary_is_told() {
        use crate::mydatabase::failover::tests::{labelled, pod};
        let mut db = held();
        db.spec.replicas = 2;
        db.spec.replication = ReplicationMode::Preferred;
        // production-db-0 serves; no standby has streamed from it for longer than the wait.
        let pods = vec![
            labelled(pod("production-db-0", Role::Primary, "0/500", None), "primary"),
            labelled(pod("production-db-1", Role::Replica, "0/400", None), "replica"),
        ];
        let alone = |reconciler: &MyDatabaseReconciler| {
            reconciler.update_state(&db, |state| {
                state.chosen = Some("production-db-0".into());
                state.chosen_uid = Some("uid-production-db-0".into());
                let since = Instant::now().checked_sub(synchronous::PREFERRED_WAIT * 2).unwrap_or_else(Instant::now);
                state.synchronous = synchronous::Watch::alone_since(since);
            })
        };
        let told = |api: &FakeApi, names: &str| {
            api.requests().iter().position(|r| {
                r.method == "PATCH"
                    && r.path.ends_with("/pods/production-db-0")
                    && r.body["metadata"]["annotations"][SYNCHRONOUS_STANDBYS] == names
            })
        };
        let (api, client) = FakeApi::new(&db);
        let first = reconciler(client, instances(&db, pods.clone()));
        alone(&first);
        pipeline::reconcile(Arc::new(db.clone()), first.clone()).await.expect("reconciles");
        let recorded = api.requests().iter().position(|r| {
            r.path.ends_with("/mydatabases/production-db/status")
                && r.body["status"]["asynchronous"]["primary"] == "production-db-0"
        });
        let stopped_waiting = told(&api, "");
        assert!(
            recorded.is_some() && stopped_waiting.is_some() && recorded < stopped_waiting,
            "recorded {recorded:?}, told {stopped_waiting:?}"
        );
        assert!(first.asynchronous(&db).is_some());

        // The record refused: the primary keeps waiting for its standby.
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/mydatabases/production-db/status", 500, "InternalError", "etcd is away");
        let reconciler = reconciler(client, instances(&db, pods));
        alone(&reconciler);
        pipeline::reconcile(Arc::new(db.clone()), reconciler.clone()).await.ok();
        assert_eq!(told(&api, ""), None, "told to go on alone without the record");
        assert!(told(&api, r#"ANY 1 ("production-db-1")"#).is_some(), "its standby stays named");
        assert_eq!(reconciler.asynchronous(&db), None);
    }

    #[tokio::test]
    async fn a_restarted_operator_follows_the_recorded_primary_not_a_stale_label() {
        use crate::mydatabase::failover::tests::{labelled, pod};
        let mut db = held();
        // Promoted and recorded, but the label writes never landed; the operator then restarted.
        db.status = Some(MyDatabaseStatus {
            current_primary: Some("production-db-1".into()),
            current_primary_uid: Some("uid-production-db-1".into()),
            ..Default::default()
        });
        let pods = vec![
            labelled(pod("production-db-0", Role::Replica, "0/500", None), "primary"),
            pod("production-db-1", Role::Replica, "0/700", Some("t1")),
            pod("production-db-2", Role::Replica, "0/500", Some("t1")),
        ];
        let (api, client) = FakeApi::new(&db);
        pipeline::reconcile(Arc::new(db.clone()), reconciler(client, instances(&db, pods))).await.expect("reconciles");
        assert!(labelled_primary_at(&api, "production-db-1").is_some(), "the recorded primary gets its label");
        let asked = api.requests().iter().any(|r| r.body.to_string().contains(POSITION_REQUEST));
        assert!(!asked, "no second failover: the recorded pod is the one chosen, not a replacement");
    }

    fn ask_pending(lost: &str, token: &str) -> Pending {
        Pending {
            token: token.into(),
            asked_at: Instant::now(),
            began: Instant::now(),
            lost_at: crate::runtime::status::now(),
            why: format!("{lost}: its pod is gone"),
            switchover: None,
            held_at: None,
            blocked_told: false,
        }
    }

    #[tokio::test]
    async fn a_refused_network_policy_holds_the_first_instances_back() {
        let db = held();
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/networkpolicies/", 403, "Forbidden", "refused by an admission policy");
        let action = pipeline::reconcile(Arc::new(db), reconciler(client, Cached::default())).await;
        assert!(action.is_err(), "a refused child is an error, retried with backoff");
        let applies = api.applies();
        assert!(applies.iter().any(|a| a == "networkpolicies/production-db"), "{applies:?}");
        assert!(!applies.iter().any(|a| a.starts_with("statefulsets/")), "instances without their policy: {applies:?}");
    }

    #[tokio::test]
    async fn reconcile_creates_every_child_in_the_declared_order() {
        let db = held();
        let (api, client) = FakeApi::new(&db);
        let action = pipeline::reconcile(Arc::new(db), reconciler(client, Cached::default())).await;
        assert_eq!(action.ok(), Some(Action::requeue(RESYNC)));
        assert_eq!(
            api.applies(),
            [
                "secrets/production-db-replication",
                "secrets/production-db-ca",
                "secrets/production-db-server",
                "secrets/production-db-credentials",
                "configmaps/production-db-scripts",
                "serviceaccounts/production-db-instance",
                "roles/production-db-instance",
                "rolebindings/production-db-instance",
                "services/production-db-headless",
                "services/production-db-rw",
                "services/production-db-ro",
                "networkpolicies/production-db",
                "persistentvolumeclaims/production-db-backups",
                "statefulsets/production-db",
                "poddisruptionbudgets/production-db",
                "poddisruptionbudgets/production-db-primary",
                "cronjobs/production-db-backup",
            ]
        );
        let secret = api
            .requests()
            .into_iter()
            .find(|r| r.is_apply() && r.path.ends_with("/production-db-credentials"))
            .expect("secret");
        assert_eq!(secret.body["data"]["password"].as_str().map(str::len), Some(44), "32 random bytes, base64");
        let status = api.status_writes();
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].body["status"]["phase"], "Creating");
    }

    #[tokio::test]
    async fn reconcile_adds_the_finalizer_before_anything_else() {
        let db = sample();
        let (api, client) = FakeApi::new(&db);
        pipeline::reconcile(Arc::new(db), reconciler(client, Cached::default())).await.expect("reconciles");
        let first_write = api.writes().into_iter().next().expect("a write");
        assert!(first_write.content_type.starts_with("application/json-patch"), "{first_write:?}");
        assert!(first_write.body.to_string().contains(FINALIZER));
    }

    #[tokio::test]
    async fn reconcile_keeps_existing_passwords() {
        let db = held();
        let (api, client) = FakeApi::new(&db);
        let secrets = vec![credentials(&db), replication(&db), ca(&db), server_tls(&db)];
        let cached = Cached { secrets, ..Default::default() };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        assert!(
            !api.applies().iter().any(|a| a.starts_with("secrets/")),
            "the Secret was rewritten: {:?}",
            api.applies()
        );
    }

    #[tokio::test]
    async fn a_database_from_before_tls_gets_its_certificates_and_keeps_its_passwords() {
        let db = held();
        let (api, client) = FakeApi::new(&db);
        // Its credentials Secret as Keelson wrote it before TLS: no ca.crt, no sslmode.
        let mut before = credentials::build(&db, &kept_passwords(), "", true).expect("builds");
        let data = before.data.get_or_insert_with(Default::default);
        data.remove(tls::CA_CERT_KEY);
        let uri = "postgresql://app:kept-app-password@production-db-rw.default.svc:5432/app";
        data.insert("uri".into(), k8s_openapi::ByteString(uri.as_bytes().to_vec()));
        // ... and its instances, which present no certificate yet.
        let mut statefulset = statefulset::build(&db, &crate::runtime::Settings::default()).expect("builds");
        if let Some(volumes) =
            statefulset.spec.as_mut().and_then(|s| s.template.spec.as_mut()).and_then(|p| p.volumes.as_mut())
        {
            volumes.retain(|v| v.name != tls::VOLUME);
        }
        let cached = Cached {
            secrets: vec![stamped(before), replication(&db)],
            statefulsets: vec![stamped(statefulset)],
            ..Default::default()
        };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        let applies = api.applies();
        let secrets: Vec<&String> = applies.iter().filter(|a| a.starts_with("secrets/")).collect();
        assert_eq!(
            secrets,
            ["secrets/production-db-ca", "secrets/production-db-server", "secrets/production-db-credentials"]
        );
        let written = |name: &str| {
            api.requests()
                .into_iter()
                .find(|r| r.is_apply() && r.path.ends_with(name))
                .map(|r| r.body)
                .expect("applied")
        };
        let text = |secret: &Value, key: &str| {
            let encoded = secret["data"][key].as_str().unwrap_or_default().to_string();
            let bytes: k8s_openapi::ByteString = serde_json::from_value(json!(encoded)).expect("base64");
            String::from_utf8(bytes.0).expect("utf8")
        };
        let app = written("/production-db-credentials");
        let ca = written("/production-db-ca");
        assert_eq!(text(&app, "password"), "kept-app-password");
        // Not told to verify a certificate no instance presents yet: `prefer` until they all do.
        assert_eq!(text(&app, "uri"), uri, "{app}");
        assert_eq!(text(&app, tls::CA_CERT_KEY), text(&ca, tls::CA_CERT_KEY), "clients get the CA that signs");
        let server = written("/production-db-server");
        assert_eq!(text(&server, tls::CA_CERT_KEY), text(&ca, tls::CA_CERT_KEY));
    }

    #[tokio::test]
    async fn reconcile_moves_the_replication_password_out_of_the_applications_secret() {
        let db = held();
        // A database from before the replication Secret: its password sits in the credentials.
        let mut legacy =
            credentials::build(&db, &kept_passwords(), &kept_certificates().ca_cert, true).expect("builds");
        let data = legacy.data.get_or_insert_with(Default::default);
        data.insert(
            credentials::REPLICATION_PASSWORD_KEY.into(),
            k8s_openapi::ByteString(b"kept-replication".to_vec()),
        );
        let legacy = stamped(legacy);
        let (api, client) = FakeApi::new(&db);
        let cached = Cached { secrets: vec![legacy, ca(&db), server_tls(&db)], ..Default::default() };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        let applies = api.applies();
        let secrets: Vec<&String> = applies.iter().filter(|a| a.starts_with("secrets/")).collect();
        assert_eq!(secrets, ["secrets/production-db-replication", "secrets/production-db-credentials"]);
        let written = |name: &str| {
            api.requests()
                .into_iter()
                .find(|r| r.is_apply() && r.path.ends_with(name))
                .map(|r| r.body)
                .expect("applied")
        };
        let replication = written("/secrets/production-db-replication");
        let kept = replication["data"][credentials::REPLICATION_PASSWORD_KEY].as_str().unwrap_or_default().to_string();
        assert_eq!(kept, "a2VwdC1yZXBsaWNhdGlvbg==", "the same password, base64: {replication}");
        let app = written("/secrets/production-db-credentials");
        assert!(app["data"].get(credentials::REPLICATION_PASSWORD_KEY).is_none(), "{app}");
    }

    #[tokio::test]
    async fn reconcile_reports_an_invalid_spec_without_touching_children() {
        let mut db = held();
        if let Some(backup) = db.spec.backup.as_mut() {
            backup.schedule = "61 2 * * *".into();
        }
        let (api, client) = FakeApi::new(&db);
        let action = pipeline::reconcile(Arc::new(db), reconciler(client, Cached::default())).await;
        assert_eq!(action.ok(), Some(Action::await_change()), "an invalid spec waits for a change, no requeue");
        assert!(api.applies().is_empty(), "{:?}", api.applies());
        let status = api.status_writes();
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].body["status"]["phase"], "Failed");
        let spec_valid = condition(&status[0].body, "SpecValid");
        assert_eq!(
            (spec_valid["status"].as_str(), spec_valid["reason"].as_str()),
            (Some("False"), Some("InvalidSchedule"))
        );
        assert!(spec_valid["message"].as_str().unwrap_or_default().contains("spec.backup.schedule"));
    }

    #[tokio::test]
    async fn reconcile_records_a_refused_statefulset_and_applies_the_rest() {
        let db = held();
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/statefulsets/production-db", 422, "Invalid", "spec.template: Invalid value");
        let result = pipeline::reconcile(Arc::new(db), reconciler(client, Cached::default())).await;
        assert!(matches!(result, Err(crate::Error::ChildrenFailed { .. })), "{result:?}");
        assert!(api.applies().contains(&"cronjobs/production-db-backup".to_string()), "later children still applied");
        let status = api.status_writes();
        assert_eq!(status.len(), 1, "status is written even when a child fails");
        assert_eq!(status[0].body["status"]["ready"], false);
        let ready = condition(&status[0].body, "Ready");
        assert_eq!(ready["reason"], "ReconcileFailed");
        assert!(ready["message"].as_str().unwrap_or_default().contains("StatefulSet production-db"));
    }

    #[tokio::test]
    async fn reconcile_waits_for_a_storage_change_without_an_error() {
        let mut db = held();
        let mut existing = stamped(statefulset::build(&db, &crate::runtime::Settings::default()).expect("builds"));
        existing.metadata.uid = Some("old-sts".into());
        db.spec.storage = "200Gi".into();
        let (api, client) = FakeApi::new(&db);
        let cached =
            Cached { statefulsets: vec![existing], claims: vec![data_claim(0), data_claim(1)], ..Default::default() };
        let reconciler = reconciler(client, cached);
        let action = pipeline::reconcile(Arc::new(db), reconciler.clone()).await;
        assert_eq!(action.ok(), Some(Action::requeue(WAIT_POLL)), "a wait is a requeue, not an error");
        let expanded: Vec<_> =
            api.requests().into_iter().filter(|r| r.method == "PATCH" && r.content_type.contains("merge")).collect();
        assert!(expanded.iter().any(|r| r.target() == "data-production-db-1" && r.body.to_string().contains("200Gi")));
        let delete = api.requests().into_iter().find(|r| r.method == "DELETE").expect("the StatefulSet is recreated");
        assert_eq!(delete.target(), "production-db");
        assert_eq!(delete.body["propagationPolicy"], "Orphan");
        assert_eq!(delete.body["preconditions"]["uid"], "old-sts");
        assert!(!reconciler.ctx.metrics.render().contains("keelson_reconcile_errors_total{"));
    }

    #[tokio::test]
    async fn reconcile_removes_children_the_spec_switched_off() {
        let db = held();
        let mut one = held();
        one.spec.replicas = 1;
        one.spec.backup = None;
        let cached = Cached {
            cron_jobs: backup::cronjob(&db, true).expect("builds").into_iter().collect(),
            disruption_budgets: {
                let budgets = pdb::build(&db).expect("builds");
                budgets.replicas.into_iter().chain(budgets.primary).collect()
            },
            ..Default::default()
        };
        let (api, client) = FakeApi::new(&one);
        pipeline::reconcile(Arc::new(one), reconciler(client, cached)).await.expect("reconciles");
        let mut removed = deletes(&api);
        removed.sort();
        assert_eq!(removed, ["production-db", "production-db-backup", "production-db-primary"]);
        assert!(!api.applies().iter().any(|a| a.starts_with("cronjobs/") || a.starts_with("poddisruptionbudgets/")));
    }

    #[tokio::test]
    async fn reconcile_deletion_under_retain_keeps_data_and_credentials() {
        let db = deleted(DeletionPolicy::Retain);
        let (api, client) = FakeApi::new(&db);
        let cached = Cached { secrets: vec![credentials(&db)], claims: vec![data_claim(0)], ..Default::default() };
        let action = pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await;
        assert_eq!(action.ok(), Some(Action::await_change()));
        assert!(deletes(&api).is_empty(), "Retain deleted {:?}", deletes(&api));
        assert!(!api.writes().iter().any(|r| r.path.contains("/secrets/")), "the Secret was touched");
        assert!(finalizer_removed(&api));
    }

    #[tokio::test]
    async fn reconcile_deletion_under_delete_removes_data_and_backups() {
        let db = deleted(DeletionPolicy::Delete);
        let (api, client) = FakeApi::new(&db);
        // A stranger's volume wearing the data volumes' selector, but not naming this database.
        let mut stranger = data_claim(2);
        stranger
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("app.kubernetes.io/instance".into(), "other".into());
        let cached = Cached {
            claims: vec![data_claim(0), data_claim(1), stranger, backup::volume_claim(&db)],
            secrets: vec![credentials(&db), replication(&db)],
            ..Default::default()
        };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        let mut removed = deletes(&api);
        removed.sort();
        assert_eq!(
            removed,
            [
                "data-production-db-0",
                "data-production-db-1",
                "production-db-backups",
                "production-db-credentials",
                "production-db-replication"
            ]
        );
        assert!(finalizer_removed(&api));
    }

    #[tokio::test]
    async fn reconcile_deletion_under_snapshot_backs_up_before_deleting() {
        let db = deleted(DeletionPolicy::Snapshot);
        let (api, client) = FakeApi::new(&db);
        let cached = Cached { claims: vec![data_claim(0)], ..Default::default() };
        let action = pipeline::reconcile(Arc::new(db.clone()), reconciler(client, cached)).await;
        assert_eq!(action.ok(), Some(Action::requeue(WAIT_POLL)), "waits for the final backup");
        assert_eq!(api.applies(), ["persistentvolumeclaims/production-db-backups", "jobs/production-db-final-backup"]);
        let job = api.requests().into_iter().rfind(|r| r.is_apply()).expect("job");
        assert_eq!(job.body["metadata"]["ownerReferences"][0]["kind"], "PersistentVolumeClaim");
        assert!(deletes(&api).is_empty() && !finalizer_removed(&api));

        let (api, client) = FakeApi::new(&db);
        let cached = Cached {
            claims: vec![data_claim(0)],
            jobs: vec![finished_job("production-db-final-backup", "Complete")],
            ..Default::default()
        };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        assert_eq!(deletes(&api), ["data-production-db-0"]);
        assert!(finalizer_removed(&api));
    }

    #[tokio::test]
    async fn reconcile_deletion_under_snapshot_keeps_data_when_no_backup_can_run() {
        let db = deleted(DeletionPolicy::Snapshot);
        let (api, client) = FakeApi::new(&db);
        let terminating = "unable to create new content in namespace default because it is being terminated";
        api.refuse("PATCH", "/persistentvolumeclaims/production-db-backups", 403, "Forbidden", terminating);
        let cached = Cached { claims: vec![data_claim(0)], ..Default::default() };
        pipeline::reconcile(Arc::new(db.clone()), reconciler(client, cached)).await.expect("reconciles");
        assert!(deletes(&api).is_empty(), "data deleted without a backup");
        assert!(finalizer_removed(&api), "a terminating namespace must not hang on the finalizer");

        let (api, client) = FakeApi::new(&db);
        let cached = Cached {
            claims: vec![data_claim(0)],
            jobs: vec![finished_job("production-db-final-backup", "Failed")],
            ..Default::default()
        };
        pipeline::reconcile(Arc::new(db), reconciler(client, cached)).await.expect("reconciles");
        assert!(deletes(&api).is_empty() && finalizer_removed(&api));
    }
}
