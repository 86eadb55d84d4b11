//! One MyDatabase reconcile, stage by stage (see `runtime::pipeline`): read
//! from the caches → validate what the schema cannot → build every child →
//! apply them in order (configuration, then the StatefulSet, then what
//! depends on it) → status from the StatefulSet and the backup Jobs.
//! Deletion runs `deletion::clean_up` under the finalizer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::ha::drain;
use super::ha::primary::{Keeper, PrimaryState, sync_fences};
use super::instance_access::{self, InstanceAccess};
use super::observed::{self, Observed};
use super::restore::{self, Progress, Restore};
use super::statefulset::TemplateChange;
use super::upgrade::{self, Template};
use super::watches::Caches;
use super::{
    backup, credentials, deletion, instances, names, network_policy, pdb, scripts, services, statefulset, status, tls,
    validation,
};
use crate::Result;
use crate::api::instance::LEASE_EXPIRES_AFTER;
use crate::api::mydatabase::{BACKUP_REQUEST_ANNOTATION, MyDatabase, MyDatabaseStatus};
use crate::runtime::{Applier, Context, Invalid, Outcome, Reconciler, Settings};

pub const CONTROLLER: &str = "mydatabase";
pub const FINALIZER: &str = "db.keelson.dev/cleanup";

pub struct MyDatabaseReconciler {
    pub ctx: Arc<Context>,
    pub caches: Caches,
    /// What this process decided about each database's primary (by
    /// `namespace/name`): it outranks the caches, which may lag its own writes.
    pub primaries: Mutex<HashMap<String, PrimaryState>>,
}

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
        observed.asynchronous = self.keeper().asynchronous(db);
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
        let (primary, mut failover_pending) = self.keeper().elect_primary(db, &observed, applier).await;
        if !failover_pending {
            failover_pending = self.keeper().move_primary(db, &observed, statefulset.as_ref(), &primary, applier).await;
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
            .keeper()
            .lease_unrenewed(db, &primary, &observed.pods)
            .map(|unrenewed| LEASE_EXPIRES_AFTER.saturating_sub(unrenewed));
        let PrimaryState { last: failover, blocked: failover_blocked, chosen, chosen_uid, synchronous_recheck, .. } =
            self.keeper().state(db);
        let asynchronous = self.keeper().asynchronous(db);
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
        self.keeper().forget_primary(db);
        self.ctx.metrics.forget_database(&db.namespace().unwrap_or_default(), &db.name_any());
        deletion::clean_up(db, observed, &self.caches, &self.ctx, applier).await;
    }
}

impl MyDatabaseReconciler {
    /// The primary's side of this reconcile (see `ha::primary`).
    pub(crate) fn keeper(&self) -> Keeper<'_> {
        Keeper { ctx: &self.ctx, caches: &self.caches, primaries: &self.primaries, controller: CONTROLLER }
    }

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
        let primary = self.keeper().state(db).chosen.or(status_primary);
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

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use crate::runtime::Action;
    use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
    use serde_json::Value;

    use super::*;
    use crate::api::mydatabase::DeletionPolicy;
    use crate::mydatabase::credentials::Passwords;
    use crate::mydatabase::tests::sample;
    use crate::runtime::drift::stamp_desired_hash;
    use crate::runtime::fake_api::{FakeApi, cache};
    use crate::runtime::outcome::{RESYNC, WAIT_POLL};
    use crate::runtime::{Metrics, pipeline};

    /// The tutorial's MyDatabase once its finalizer is in place.
    pub(crate) fn held() -> MyDatabase {
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
    pub(crate) struct Cached {
        statefulsets: Vec<StatefulSet>,
        secrets: Vec<Secret>,
        cron_jobs: Vec<CronJob>,
        disruption_budgets: Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
        jobs: Vec<Job>,
        claims: Vec<PersistentVolumeClaim>,
        pods: Vec<Pod>,
    }

    pub(crate) fn reconciler(client: kube::Client, cached: Cached) -> Arc<MyDatabaseReconciler> {
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

    /// The StatefulSet of `db` as the cache holds it, and `pods` (named, with
    /// reports) made its own, each with the uid `uid-<name>`.
    pub(crate) fn instances(db: &MyDatabase, pods: Vec<Pod>) -> Cached {
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
