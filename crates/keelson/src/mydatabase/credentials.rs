//! The database's Secrets, by audience: `<name>-credentials` holds what an
//! application needs to connect, and nothing more; `<name>-replication`
//! holds the replication role's password, which only the instances mount.
//! Passwords are generated once and then read back, never rotated silently.
//! They belong to no owner: the deletion policy decides their fate.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rand::Rng;

use super::names::{self, APP_DB, APP_USER, PORT};
use super::secret_data::read;
use super::tls::CA_CERT_KEY;
use crate::Result;
use crate::api::MyDatabase;

pub const PASSWORD_KEY: &str = "password";
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";
/// Where the instances see the superuser's password (`spec.superuserAccess`).
pub const SUPERUSER_PASSWORD_KEY: &str = "superuser-password";
pub const SUPERUSER: &str = "postgres";

/// The two passwords a database needs.
#[derive(Clone, PartialEq, Eq)]
pub struct Passwords {
    pub app: String,
    pub replication: String,
}

impl std::fmt::Debug for Passwords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Passwords(<redacted>)")
    }
}

fn random_password() -> String {
    rand::rng().sample_iter(rand::distr::Alphanumeric).take(32).map(char::from).collect()
}

/// The passwords already in the Secrets, or new random ones for what is
/// missing. The replication password of a database from before the
/// replication Secret is taken from the credentials Secret once, so that
/// moving it changes nothing.
pub fn passwords(credentials: Option<&Secret>, replication: Option<&Secret>) -> Passwords {
    Passwords {
        app: read(credentials, PASSWORD_KEY).unwrap_or_else(random_password),
        replication: read(replication, REPLICATION_PASSWORD_KEY)
            .or_else(|| read(credentials, REPLICATION_PASSWORD_KEY))
            .unwrap_or_else(random_password),
    }
}

/// Builds the Secret `<name>-credentials`: what an application needs to
/// connect, in the forms drivers take (`uri`, `jdbc-uri`, a `pgpass` line),
/// and `ca.crt`, the CA that signed the server's certificate: the URIs ask
/// for `sslmode=verify-full`, which needs it (`PGSSLROOTCERT`, or
/// `~/.postgresql/root.crt`).
/// `verify_server`: the URIs ask for `sslmode=verify-full` once every instance presents the
/// certificate (see `tls::served`); before that (a database from before TLS being rolled),
/// libpq's default, `prefer`.
pub fn build(db: &MyDatabase, passwords: &Passwords, ca_cert: &str, verify_server: bool) -> Result<Secret> {
    let namespace = db.namespace().unwrap_or_default();
    let host = format!("{}.{namespace}.svc", names::rw_service(db));
    let (query, jdbc_option) = if verify_server { ("?sslmode=verify-full", "&sslmode=verify-full") } else { ("", "") };
    let uri = format!("postgresql://{APP_USER}:{}@{host}:{PORT}/{APP_DB}{query}", passwords.app);
    let jdbc =
        format!("jdbc:postgresql://{host}:{PORT}/{APP_DB}?user={APP_USER}&password={}{jdbc_option}", passwords.app);
    // pgpass escapes `:` and `\` in its fields; the generated passwords have neither, a user's may.
    let escaped = passwords.app.replace('\\', "\\\\").replace(':', "\\:");
    let pgpass = format!("{host}:{PORT}:{APP_DB}:{APP_USER}:{escaped}\n");
    let data: BTreeMap<String, ByteString> = [
        ("username", APP_USER.to_string()),
        (PASSWORD_KEY, passwords.app.clone()),
        ("database", APP_DB.to_string()),
        ("host", host),
        ("port", PORT.to_string()),
        ("uri", uri),
        ("jdbc-uri", jdbc),
        ("pgpass", pgpass),
        (CA_CERT_KEY, ca_cert.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Ok(Secret {
        // Not owned: the Secret outlives the MyDatabase with the data it unlocks
        // (Retain, Snapshot), and is deleted explicitly under Delete. Releasing
        // it from an owner later would need the right to delete any Secret
        // wherever owner references are enforced (OwnerReferencesPermissionEnforcement).
        metadata: names::unowned_meta(db, names::credentials(db), "credentials"),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    })
}

/// Builds the Secret `<name>-replication`: the replication role's password,
/// for the instances only (a client holding it could copy every database of
/// the cluster with `pg_basebackup`), and the superuser's with
/// `spec.superuserAccess` (the instances take it from here, a Secret Keelson
/// has confirmed as its own).
pub fn build_replication(db: &MyDatabase, passwords: &Passwords, superuser: Option<&str>) -> Secret {
    let mut data: BTreeMap<String, ByteString> =
        [(REPLICATION_PASSWORD_KEY.to_string(), ByteString(passwords.replication.clone().into_bytes()))].into();
    if let Some(password) = superuser {
        data.insert(SUPERUSER_PASSWORD_KEY.into(), ByteString(password.as_bytes().to_vec()));
    }
    Secret {
        metadata: names::unowned_meta(db, names::replication_secret(db), "replication"),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The superuser's password: as the instances have it, else as the DBA's Secret has it, else new.
pub fn superuser_password(superuser: Option<&Secret>, replication: Option<&Secret>) -> String {
    read(replication, SUPERUSER_PASSWORD_KEY).or_else(|| read(superuser, PASSWORD_KEY)).unwrap_or_else(random_password)
}

/// Builds the Secret `<name>-superuser` (with `spec.superuserAccess`): the
/// `postgres` role's password and how to connect, for DBAs. Owned: it goes
/// when access is turned off or the database is deleted.
pub fn build_superuser(db: &MyDatabase, password: &str, ca_cert: &str) -> Result<Secret> {
    let namespace = db.namespace().unwrap_or_default();
    let host = format!("{}.{namespace}.svc", names::rw_service(db));
    let uri = format!("postgresql://{SUPERUSER}:{password}@{host}:{PORT}/postgres?sslmode=verify-full");
    let data: BTreeMap<String, ByteString> = [
        ("username", SUPERUSER.to_string()),
        (PASSWORD_KEY, password.to_string()),
        ("host", host),
        ("port", PORT.to_string()),
        ("uri", uri),
        (CA_CERT_KEY, ca_cert.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Ok(Secret {
        metadata: names::owned_meta(db, names::superuser_secret(db), "superuser")?,
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn passwords_are_random_and_then_kept() {
        let first = passwords(None, None);
        assert_eq!(first.app.len(), 32);
        assert_ne!(first.app, first.replication);
        assert_ne!(passwords(None, None).app, first.app);
        let secret = build(&sample(), &first, "ca", true).expect("builds");
        let replication = build_replication(&sample(), &first, None);
        assert_eq!(passwords(Some(&secret), Some(&replication)), first);
    }

    #[test]
    fn secret_has_connection_details_and_never_prints_passwords() {
        let pw = Passwords { app: "s3cret".into(), replication: "r3pl".into() };
        let secret = build(&sample(), &pw, "ca", true).expect("builds");
        let data = secret.data.expect("data");
        let text = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf8");
        assert_eq!(text("host"), "production-db-rw.default.svc");
        assert_eq!(text("port"), "5432");
        assert_eq!(text("uri"), "postgresql://app:s3cret@production-db-rw.default.svc:5432/app?sslmode=verify-full");
        assert_eq!(
            text("jdbc-uri"),
            "jdbc:postgresql://production-db-rw.default.svc:5432/app?user=app&password=s3cret&sslmode=verify-full"
        );
        assert_eq!(text("ca.crt"), "ca");
        // Before every instance presents the certificate: libpq's default, no verification asked.
        let rolling = build(&sample(), &pw, "ca", false).expect("builds").data.expect("data");
        assert_eq!(rolling["uri"].0, b"postgresql://app:s3cret@production-db-rw.default.svc:5432/app");
        assert_eq!(text("pgpass"), "production-db-rw.default.svc:5432:app:app:s3cret\n");
        assert!(!format!("{pw:?}").contains("s3cret"));
    }

    #[test]
    fn the_application_secret_holds_no_replication_credential() {
        let pw = Passwords { app: "s3cret".into(), replication: "r3pl".into() };
        let secret = build(&sample(), &pw, "ca", true).expect("builds");
        let data = secret.data.expect("data");
        assert!(data.values().all(|v| !String::from_utf8_lossy(&v.0).contains("r3pl")), "{:?}", data.keys());
        let replication = build_replication(&sample(), &pw, None);
        assert_eq!(replication.metadata.name.as_deref(), Some("production-db-replication"));
        assert_eq!(replication.data.expect("data")[REPLICATION_PASSWORD_KEY].0, b"r3pl");
    }

    #[test]
    fn the_superusers_secret_is_its_own_and_kept() {
        let secret = build_superuser(&sample(), "su-pass", "ca").expect("builds");
        assert_eq!(secret.metadata.name.as_deref(), Some("production-db-superuser"));
        assert!(secret.metadata.owner_references.is_some(), "goes with access or the database");
        assert_eq!(superuser_password(Some(&secret), None), "su-pass");
        assert_eq!(superuser_password(None, None).len(), 32);
        let pw = Passwords { app: "a".into(), replication: "r".into() };
        let replication = build_replication(&sample(), &pw, Some("kept-su"));
        assert_eq!(superuser_password(Some(&secret), Some(&replication)), "kept-su", "the instances' copy wins");
        assert!(!build_replication(&sample(), &pw, None).data.expect("data").contains_key(SUPERUSER_PASSWORD_KEY));
        let uri = String::from_utf8(secret.data.expect("data")["uri"].0.clone()).expect("utf8");
        assert_eq!(uri, "postgresql://postgres:su-pass@production-db-rw.default.svc:5432/postgres?sslmode=verify-full");
    }

    #[test]
    fn a_replication_password_from_before_its_own_secret_is_kept() {
        let mut legacy =
            build(&sample(), &Passwords { app: "a".into(), replication: "unused".into() }, "ca", true).expect("builds");
        legacy
            .data
            .get_or_insert_with(Default::default)
            .insert(REPLICATION_PASSWORD_KEY.into(), ByteString(b"old-repl".to_vec()));
        assert_eq!(passwords(Some(&legacy), None).replication, "old-repl");
    }
}
