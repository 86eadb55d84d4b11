//! The StatefulSet running PostgreSQL: pod 0 is the primary, the others
//! stream from it (see `scripts/keelson-postgres.sh start`).

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort, DownwardAPIProjection,
    DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource,
    SecretKeySelector, SecretProjection, SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::credentials::{PASSWORD_KEY, REPLICATION_PASSWORD_KEY, SUPERUSER_PASSWORD_KEY};
use super::names::{self, APP_DB, APP_USER, PORT};
use super::tls::{CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY};
use super::{parameters, placement, resources, scripts};
use crate::Result;
use crate::api::MyDatabase;
use crate::runtime::{Settings, drift, meta, security};

/// The official image runs as `postgres`, uid 999.
pub const POSTGRES_UID: i64 = 999;
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";

pub fn image(db: &MyDatabase) -> String {
    format!("{}:{}", db.spec.image_repository, db.spec.version)
}

pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

/// `name` from `key` of the application's Secret.
pub fn secret_env(db: &MyDatabase, name: &str, key: &str) -> EnvVar {
    env_from_secret(names::credentials(db), name, key)
}

fn env_from_secret(secret: String, name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret, key: key.into(), optional: Some(false) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn scripts_volume(db: &MyDatabase) -> Volume {
    Volume {
        name: "scripts".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: names::scripts(db),
            default_mode: Some(0o555),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where instances see the credentials Secret as files: unlike environment
/// variables, they follow the Secret, so a changed password reaches the roles
/// without a restart (the script's `watch_credentials`).
pub const CREDENTIALS_MOUNT: &str = "/etc/keelson/credentials";

/// The Secrets' passwords in one folder: the application's, the replication role's, and the
/// superuser's where access is on.
fn credentials_volume(db: &MyDatabase) -> Volume {
    let source = |secret: String, key: &str, path: &str, optional: bool| VolumeProjection {
        secret: Some(SecretProjection {
            name: secret,
            items: Some(vec![KeyToPath { key: key.into(), path: path.into(), mode: None }]),
            optional: Some(optional),
        }),
        ..Default::default()
    };
    Volume {
        name: "credentials".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                source(names::credentials(db), PASSWORD_KEY, PASSWORD_KEY, false),
                source(names::replication_secret(db), REPLICATION_PASSWORD_KEY, REPLICATION_PASSWORD_KEY, false),
                // There only with spec.superuserAccess (optional: toggling it changes no pod). From
                // the replication Secret, which Keelson has confirmed as its own, never from
                // `<name>-superuser`: anyone who may create a Secret of that name could set it.
                source(names::replication_secret(db), SUPERUSER_PASSWORD_KEY, SUPERUSER_PASSWORD_KEY, true),
            ]),
            default_mode: Some(0o440),
        }),
        ..Default::default()
    }
}

/// Where instances see their certificate and key (`<name>-server`); the
/// script copies them for PostgreSQL, which wants a key only its user reads.
pub const SERVER_TLS_MOUNT: &str = "/etc/keelson/tls";
/// Where a client pod of Keelson's (a backup) sees the CA to verify the server with.
pub const CLIENT_CA_MOUNT: &str = "/etc/keelson/ca";

fn server_tls_volume(db: &MyDatabase) -> Volume {
    let items = [TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY]
        .iter()
        .map(|key| KeyToPath { key: key.to_string(), path: key.to_string(), mode: None })
        .collect();
    Volume {
        name: super::tls::VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(super::tls::server_secret_name(db)),
            items: Some(items),
            default_mode: Some(0o440),
            optional: Some(false),
        }),
        ..Default::default()
    }
}

/// How replicas check a primary whose pod presents the database's certificate.
pub const UPSTREAM_SSLMODE: &str = "verify-ca";

/// How a replica checks the primary in `pod`: by the CA when the pod mounts
/// the certificate; a pod from before TLS (rolled away soon) offers none.
pub fn upstream_sslmode(pod: &Pod) -> &'static str {
    let presents_certificate =
        pod.spec.iter().flat_map(|spec| spec.volumes.iter().flatten()).any(|v| v.name == super::tls::VOLUME);
    if presents_certificate { UPSTREAM_SSLMODE } else { "prefer" }
}

/// The CA from the credentials Secret, for Keelson's own clients (backups).
pub fn client_ca_volume(db: &MyDatabase) -> Volume {
    Volume {
        name: "client-ca".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::credentials(db)),
            items: Some(vec![KeyToPath { key: CA_CERT_KEY.into(), path: CA_CERT_KEY.into(), mode: None }]),
            default_mode: Some(0o444),
            optional: Some(false),
        }),
        ..Default::default()
    }
}

pub fn client_ca_mount() -> VolumeMount {
    VolumeMount { read_only: Some(true), ..mount("client-ca", CLIENT_CA_MOUNT) }
}

/// libpq's settings for a client that verifies the server as applications do
/// (`prefer` while a database from before TLS is being rolled onto it).
pub fn client_tls_env(verify_server: bool) -> Vec<EnvVar> {
    let mode = if verify_server { "verify-full" } else { "prefer" };
    vec![env("PGSSLMODE", mode), env("PGSSLROOTCERT", format!("{CLIENT_CA_MOUNT}/{CA_CERT_KEY}"))]
}

pub fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

pub fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
}

/// Readiness as clients mean it: the primary accepts connections, a replica
/// streams (the script's `ready`). Checked often: the Services follow it.
fn ready_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["/bin/bash".into(), format!("/scripts/{}", names::SCRIPT), "ready".into()]),
        }),
        period_seconds: Some(2),
        timeout_seconds: Some(3),
        failure_threshold: Some(2),
        ..Default::default()
    }
}

/// Liveness (the script's `live`): the server accepts connections, or its
/// container is still setting it up or recovering (a clone, a rewind, crash
/// recovery of a large database take as long as they take). Only a server
/// that answered once and then stopped answering for 30 s is restarted.
fn live_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["/bin/bash".into(), format!("/scripts/{}", names::SCRIPT), "live".into()]),
        }),
        period_seconds: Some(5),
        timeout_seconds: Some(3),
        failure_threshold: Some(6),
        ..Default::default()
    }
}

/// What the script needs to set up an instance's data: where, the port, the
/// application's database and role. The instances read the passwords from
/// their mounted Secrets (`CREDENTIALS_DIR`): no password in the environment
/// of a long-running process.
pub fn instance_env() -> Vec<EnvVar> {
    vec![
        env("PGDATA", format!("{DATA_MOUNT}/pgdata")),
        env("PGPORT", PORT.to_string()),
        env("APP_DB", APP_DB),
        env("APP_USER", APP_USER),
    ]
}

/// Both passwords from their Secrets, for a Job that runs once (a restore).
pub fn password_env(db: &MyDatabase) -> Vec<EnvVar> {
    vec![
        secret_env(db, "APP_PASSWORD", PASSWORD_KEY),
        env_from_secret(names::replication_secret(db), "REPLICATION_PASSWORD", REPLICATION_PASSWORD_KEY),
    ]
}

/// A backup's or restore's pod: it runs once, talks to PostgreSQL only (no API
/// token), as the image's non-root user, on the nodes the user allowed.
pub fn job_pod(db: &MyDatabase, container: Container, volumes: Vec<Volume>) -> PodSpec {
    placement::job(
        db,
        PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            security_context: Some(security::restricted_pod(POSTGRES_UID, Some(POSTGRES_UID))),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        },
    )
}

/// An instance's data volume claim: the StatefulSet's template (`data`), or a
/// claim made ahead of it under the name the StatefulSet will adopt.
pub fn data_claim(db: &MyDatabase, name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(names::labels(db, "database")),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity(db.spec.storage.clone()))].into()),
                ..Default::default()
            }),
            storage_class_name: db.spec.storage_class_name.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every pod is created at once, whatever the others' readiness: the primary
/// may be at any ordinal, and `OrderedReady` would hold its pod back behind a
/// lower ordinal that cannot be ready without it (a replica streams from it).
/// Replicas wait for the primary themselves (`keelson-postgres.sh`).
pub const POD_MANAGEMENT: &str = "Parallel";

/// Where the instance manager's binary is copied to, in each pod.
const MANAGER_DIR: &str = "/keelson";
/// Where in-cluster clients look for their ServiceAccount's token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// On the pod template: the hash of the scripts the pods run.
pub const SCRIPTS_HASH: &str = "db.keelson.dev/scripts-hash";

/// The init container that copies the instance manager into the pod.
pub const INSTALL_CONTAINER: &str = "install-instance-manager";
/// The instance manager's container.
pub const MANAGER_CONTAINER: &str = "instance-manager";
/// The volume the instance manager's binary and orders live in.
pub const MANAGER_VOLUME: &str = "instance-manager";
/// Where the install container (and an in-place upgrade's) mounts `MANAGER_VOLUME`.
pub const INSTALL_DIR: &str = "/install";
const INSTALL_TO: &str = "/install/keelson";

/// `keelson instance install` of `image`'s binary to `to`, recording the image beside it.
pub fn install_command(image: &str, to: &str) -> Vec<String> {
    ["/keelson", "instance", "install", to, "--image", image].map(String::from).to_vec()
}

/// The instance manager (`crate::instance`): copied out of the operator's
/// image by an init container, run beside PostgreSQL from the PostgreSQL
/// image (it asks the server through `psql` on the shared socket).
fn instance_manager(db: &MyDatabase, settings: &Settings) -> (Container, Container) {
    let install = Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(settings.instance_image.clone()),
        // The image's binary is /keelson itself: the folder goes elsewhere here.
        command: Some(install_command(&settings.instance_image, INSTALL_TO)),
        resources: Some(resources::manager(&resources::postgres(db))),
        security_context: Some(security::restricted_container()),
        volume_mounts: Some(vec![mount(MANAGER_VOLUME, INSTALL_DIR)]),
        ..Default::default()
    };
    let run = Container {
        name: MANAGER_CONTAINER.into(),
        image: Some(image(db)),
        // PostgreSQL's metrics (`instance::metrics`), for a PodMonitor.
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: i32::from(crate::instance::metrics::PORT),
            ..Default::default()
        }]),
        command: Some(vec![format!("{MANAGER_DIR}/keelson"), "instance".into(), "run".into()]),
        env: Some(vec![
            meta::field_env("POD_NAME", "metadata.name"),
            meta::field_env("POD_NAMESPACE", "metadata.namespace"),
            env("PGHOST", "/var/run/postgresql"),
            env("PGPORT", PORT.to_string()),
        ]),
        resources: Some(resources::manager(&resources::postgres(db))),
        security_context: Some(security::restricted_container()),
        volume_mounts: Some(vec![
            // It writes the operator's orders here for PostgreSQL's container.
            mount(MANAGER_VOLUME, MANAGER_DIR),
            mount("run", "/var/run/postgresql"),
            VolumeMount { read_only: Some(true), ..mount("instance-token", TOKEN_DIR) },
        ]),
        ..Default::default()
    };
    (install, run)
}

/// The ServiceAccount token, for the instance manager's container only.
fn instance_token_volume() -> Volume {
    Volume {
        name: "instance-token".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath { key: "ca.crt".into(), path: "ca.crt".into(), mode: None }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
            default_mode: Some(0o440),
        }),
        ..Default::default()
    }
}

/// Builds the desired StatefulSet for `db`.
pub fn build(db: &MyDatabase, settings: &Settings) -> Result<StatefulSet> {
    build_with_scripts(db, settings, &scripts_hash(&scripts::build(db)?)?)
}

/// The hash of the scripts ConfigMap's content, which the pod template carries.
pub fn scripts_hash(scripts: &ConfigMap) -> Result<String> {
    drift::content_hash(&scripts.data, "scripts")
}

/// [`build`] with the scripts' hash already taken (a reconcile renders them once).
pub fn build_with_scripts(db: &MyDatabase, settings: &Settings, scripts_hash: &str) -> Result<StatefulSet> {
    let labels = names::labels(db, "database");
    let container = Container {
        name: "postgres".into(),
        image: Some(image(db)),
        command: Some(vec!["/bin/bash".into(), format!("/scripts/{}", names::SCRIPT), "start".into()]),
        env: Some(
            vec![meta::field_env("POD_NAME", "metadata.name")]
                .into_iter()
                .chain(instance_env())
                .chain([
                    // Whichever pod is the primary: replicas clone, stream and rejoin through -rw.
                    env("PRIMARY_HOST", names::rw_service(db)),
                    env("PRIMARY_PORT", PORT.to_string()),
                    env("CREDENTIALS_DIR", CREDENTIALS_MOUNT),
                    env("TLS_DIR", SERVER_TLS_MOUNT),
                    // Computes the SCRAM verifiers the roles' passwords are set with.
                    env("KEELSON_BIN", format!("{MANAGER_DIR}/keelson")),
                    // The operator's orders (role, synchronous standbys), from the instance manager.
                    env("ORDERS_DIR", MANAGER_DIR),
                ])
                // spec.postgresql.parameters, written to the file postgresql.conf includes
                // (none set: no variable, and the template of a database without any stays as it was).
                .chain(
                    Some(parameters::conf(&postgresql_parameters(db)))
                        .filter(|c| !c.is_empty())
                        .map(|conf| env(parameters::ENV, conf)),
                )
                .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("postgresql".into()),
            container_port: PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(ready_probe()),
        liveness_probe: Some(live_probe()),
        resources: Some(resources::postgres(db)),
        // A failing container's last log lines become its termination message (shown in status).
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(security::restricted_container()),
        volume_mounts: Some(vec![
            mount("data", DATA_MOUNT),
            mount("scripts", "/scripts"),
            VolumeMount { read_only: Some(true), ..mount(MANAGER_VOLUME, MANAGER_DIR) },
            mount("run", "/var/run/postgresql"),
            mount("tmp", "/tmp"),
            VolumeMount { read_only: Some(true), ..mount("credentials", CREDENTIALS_MOUNT) },
            VolumeMount { read_only: Some(true), ..mount("server-tls", SERVER_TLS_MOUNT) },
        ]),
        ..Default::default()
    };
    let claim = data_claim(db, "data");
    let (install_manager, run_manager) = instance_manager(db, settings);
    Ok(StatefulSet {
        metadata: names::owned_meta(db, names::statefulset(db), "database")?,
        spec: Some(StatefulSetSpec {
            replicas: Some(db.spec.replicas),
            service_name: Some(names::headless_service(db)),
            selector: LabelSelector { match_labels: Some(names::pod_selector(db)), ..Default::default() },
            pod_management_policy: Some(POD_MANAGEMENT.into()),
            // Keelson replaces outdated pods itself: replicas one at a time,
            // then a switchover, then the former primary (see `rollout`).
            update_strategy: Some(StatefulSetUpdateStrategy { type_: Some("OnDelete".into()), ..Default::default() }),
            // Data volumes outlive the StatefulSet; the deletion policy decides their fate.
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Retain".into()),
                when_scaled: Some("Retain".into()),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    // `kubectl exec|logs` without -c mean PostgreSQL's container.
                    annotations: Some(
                        [
                            ("kubectl.kubernetes.io/default-container".to_string(), "postgres".to_string()),
                            // A running container keeps the scripts it started with: a change of them
                            // is a change of the pods (an operator upgrade holds it, see `upgrade`).
                            (SCRIPTS_HASH.to_string(), scripts_hash.to_string()),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(placement::instance(
                    db,
                    PodSpec {
                        security_context: Some(security::restricted_pod(POSTGRES_UID, Some(POSTGRES_UID))),
                        termination_grace_period_seconds: Some(30),
                        service_account_name: Some(names::instance_access(db)),
                        automount_service_account_token: Some(false),
                        init_containers: Some(vec![install_manager]),
                        containers: vec![container, run_manager],
                        volumes: Some(vec![
                            scripts_volume(db),
                            credentials_volume(db),
                            server_tls_volume(db),
                            empty_dir("run"),
                            empty_dir("tmp"),
                            empty_dir(MANAGER_VOLUME),
                            instance_token_volume(),
                        ]),
                        ..Default::default()
                    },
                )),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// `spec.postgresql.parameters`, none when unset.
fn postgresql_parameters(db: &MyDatabase) -> std::collections::BTreeMap<String, String> {
    db.spec.postgresql.as_ref().map(|p| p.parameters.clone()).unwrap_or_default()
}

/// The storage request in an existing StatefulSet's data claim template.
pub fn template_storage(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .as_ref()?
        .volume_claim_templates
        .as_ref()?
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("data"))?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

/// What an existing StatefulSet needs that an update cannot give it (its
/// claim templates and pod management policy are immutable).
#[derive(Debug, PartialEq, Eq)]
pub enum TemplateChange {
    /// Nothing (or there is no StatefulSet).
    None,
    /// `spec.storage` grew: expand the PVCs from this size, then recreate the StatefulSet.
    Grow { from: String },
    /// Created with this pod management policy (`OrderedReady`, by an earlier
    /// version): recreate the StatefulSet as `Parallel`.
    Migrate { from: String },
    /// The old StatefulSet is going away (orphaning its pods); the next one gets the new template.
    Recreating,
}

pub fn template_change(db: &MyDatabase, existing: Option<&StatefulSet>) -> TemplateChange {
    let Some(existing) = existing else { return TemplateChange::None };
    if existing.metadata.deletion_timestamp.is_some() {
        return TemplateChange::Recreating;
    }
    if let Some(current) = template_storage(existing)
        && let (Some(have), Some(want)) = (drift::parse_quantity(&current), drift::parse_quantity(&db.spec.storage))
        && want > have
    {
        return TemplateChange::Grow { from: current };
    }
    match existing.spec.as_ref().and_then(|s| s.pod_management_policy.as_deref()) {
        Some(policy) if policy != POD_MANAGEMENT => TemplateChange::Migrate { from: policy.to_string() },
        _ => TemplateChange::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn statefulset_runs_the_tutorial_database_safely() {
        let sts = build(&sample(), &Settings::default()).expect("builds");
        let spec = sts.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.service_name.as_deref(), Some("production-db-headless"));
        assert_eq!(template_storage(&sts).as_deref(), Some("100Gi"));
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("postgres:15.2"));
        let probe = container.readiness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone());
        assert_eq!(probe.expect("probe")[1..], ["/scripts/keelson-postgres.sh".to_string(), "ready".to_string()]);
        let spread = pod.topology_spread_constraints.as_ref().expect("spread over nodes");
        assert_eq!(spread[0].topology_key, "kubernetes.io/hostname");
        let env = container.env.as_ref().expect("env");
        // Passwords come from the mounted Secrets' files, never the environment.
        assert!(!env.iter().any(|e| e.name.contains("PASSWORD")), "{env:?}");
        assert!(env.iter().any(|e| e.name == "CREDENTIALS_DIR"));
        let primary = env.iter().find(|e| e.name == "PRIMARY_HOST").and_then(|e| e.value.clone());
        assert_eq!(primary.as_deref(), Some("production-db-rw"), "the primary is whichever pod -rw selects");
    }

    #[test]
    fn knobs_reach_the_template_and_their_absence_leaves_it_as_it_was() {
        let env_of = |db: &MyDatabase| {
            let sts = build(db, &Settings::default()).expect("builds");
            let pod = sts.spec.and_then(|s| s.template.spec).expect("pod");
            pod.containers[0].env.clone().unwrap_or_default()
        };
        assert!(!env_of(&sample()).iter().any(|e| e.name == parameters::ENV), "no parameters, no variable");
        let mut db = sample();
        db.spec.postgresql = Some(crate::api::mydatabase::PostgresqlSpec {
            parameters: [("work_mem".to_string(), "16MB".to_string())].into(),
        });
        db.spec.storage_class_name = Some("fast".into());
        let conf = env_of(&db).into_iter().find(|e| e.name == parameters::ENV).and_then(|e| e.value);
        assert_eq!(conf.as_deref(), Some("work_mem = '16MB'\n"));
        let sts = build(&db, &Settings::default()).expect("builds");
        let claim = sts.spec.and_then(|s| s.volume_claim_templates).unwrap_or_default();
        assert_eq!(claim[0].spec.as_ref().and_then(|s| s.storage_class_name.as_deref()), Some("fast"));
    }

    #[test]
    fn the_instance_manager_comes_from_the_operator_image_and_alone_holds_a_token() {
        let settings = Settings { instance_image: "keelson:dev-1".into(), ..Default::default() };
        let sts = build(&sample(), &settings).expect("builds");
        let pod = sts.spec.and_then(|s| s.template.spec).expect("pod");
        let install = &pod.init_containers.as_ref().expect("init containers")[0];
        assert_eq!(install.image.as_deref(), Some("keelson:dev-1"));
        assert_eq!(pod.service_account_name.as_deref(), Some("production-db-instance"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let with_token: Vec<&str> = pod
            .containers
            .iter()
            .filter(|c| c.volume_mounts.iter().flatten().any(|m| m.name == "instance-token"))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(with_token, ["instance-manager"]);
        let manager = pod.containers.iter().find(|c| c.name == "instance-manager").expect("manager");
        assert_eq!(manager.image.as_deref(), Some("postgres:15.2"), "it runs psql from the PostgreSQL image");
    }

    #[test]
    fn postgres_alone_sees_the_server_certificate_and_replicas_verify_it() {
        let sts = build(&sample(), &Settings::default()).expect("builds");
        let pod = sts.spec.and_then(|s| s.template.spec).expect("pod");
        let volume = pod.volumes.iter().flatten().find(|v| v.name == "server-tls").expect("volume");
        assert_eq!(volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()), Some("production-db-server"));
        let mounts = |c: &Container| c.volume_mounts.iter().flatten().any(|m| m.name == "server-tls");
        let postgres = pod.containers.iter().find(|c| c.name == "postgres").expect("postgres");
        assert!(mounts(postgres) && pod.containers.iter().filter(|c| mounts(c)).count() == 1);
        let tls_dir = postgres.env.iter().flatten().find(|e| e.name == "TLS_DIR").and_then(|e| e.value.clone());
        assert_eq!(tls_dir.as_deref(), Some(SERVER_TLS_MOUNT));
        let instance = Pod { spec: Some(pod), ..Default::default() };
        assert_eq!(upstream_sslmode(&instance), "verify-ca");
        assert_eq!(upstream_sslmode(&Pod::default()), "prefer", "a primary from before TLS offers none");
        // The superuser's password comes from the Secret Keelson confirmed, never `<name>-superuser`.
        let template = serde_json::to_string(&instance.spec).expect("serializes");
        assert!(!template.contains("production-db-superuser"), "{template}");
        assert!(template.contains("superuser-password"));
    }

    #[test]
    fn image_repository_is_overridable() {
        let mut db = sample();
        db.spec.image_repository = "registry.example.com/pg".into();
        assert_eq!(image(&db), "registry.example.com/pg:15.2");
    }

    #[test]
    fn storage_grows_by_recreating_and_never_shrinks() {
        let mut db = sample();
        let sts = build(&db, &Settings::default()).expect("builds");
        assert_eq!(template_change(&db, Some(&sts)), TemplateChange::None);
        assert_eq!(template_change(&db, None), TemplateChange::None);
        db.spec.storage = "200Gi".into();
        assert_eq!(template_change(&db, Some(&sts)), TemplateChange::Grow { from: "100Gi".into() });
        db.spec.storage = "50Gi".into();
        assert_eq!(template_change(&db, Some(&sts)), TemplateChange::None);
        // Made by an earlier version, ordered: recreated as Parallel (the primary may be at any ordinal).
        let mut ordered = sts.clone();
        if let Some(spec) = ordered.spec.as_mut() {
            spec.pod_management_policy = Some("OrderedReady".into());
        }
        db.spec.storage = "100Gi".into();
        assert_eq!(template_change(&db, Some(&ordered)), TemplateChange::Migrate { from: "OrderedReady".into() });
        let mut going = sts;
        going.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        assert_eq!(template_change(&db, Some(&going)), TemplateChange::Recreating);
    }
}
