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
use crate::Result;
use crate::api::MyDatabase;

pub const PASSWORD_KEY: &str = "password";
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";

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

fn read(secret: Option<&Secret>, key: &str) -> Option<String> {
    secret
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|v| !v.is_empty())
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
/// connect, in the forms drivers take (`uri`, `jdbc-uri`, a `pgpass` line).
pub fn build(db: &MyDatabase, passwords: &Passwords) -> Result<Secret> {
    let namespace = db.namespace().unwrap_or_default();
    let host = format!("{}.{namespace}.svc", names::rw_service(db));
    let uri = format!("postgresql://{APP_USER}:{}@{host}:{PORT}/{APP_DB}", passwords.app);
    let jdbc = format!("jdbc:postgresql://{host}:{PORT}/{APP_DB}?user={APP_USER}&password={}", passwords.app);
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
/// the cluster with `pg_basebackup`).
pub fn build_replication(db: &MyDatabase, passwords: &Passwords) -> Secret {
    let data = [(REPLICATION_PASSWORD_KEY.to_string(), ByteString(passwords.replication.clone().into_bytes()))];
    Secret {
        metadata: names::unowned_meta(db, names::replication_secret(db), "replication"),
        type_: Some("Opaque".into()),
        data: Some(data.into()),
        ..Default::default()
    }
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
        let secret = build(&sample(), &first).expect("builds");
        let replication = build_replication(&sample(), &first);
        assert_eq!(passwords(Some(&secret), Some(&replication)), first);
    }

    #[test]
    fn secret_has_connection_details_and_never_prints_passwords() {
        let pw = Passwords { app: "s3cret".into(), replication: "r3pl".into() };
        let secret = build(&sample(), &pw).expect("builds");
        let data = secret.data.expect("data");
        let text = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf8");
        assert_eq!(text("host"), "production-db-rw.default.svc");
        assert_eq!(text("port"), "5432");
        assert_eq!(text("uri"), "postgresql://app:s3cret@production-db-rw.default.svc:5432/app");
        assert_eq!(
            text("jdbc-uri"),
            "jdbc:postgresql://production-db-rw.default.svc:5432/app?user=app&password=s3cret"
        );
        assert_eq!(text("pgpass"), "production-db-rw.default.svc:5432:app:app:s3cret\n");
        assert!(!format!("{pw:?}").contains("s3cret"));
    }

    #[test]
    fn the_application_secret_holds_no_replication_credential() {
        let pw = Passwords { app: "s3cret".into(), replication: "r3pl".into() };
        let secret = build(&sample(), &pw).expect("builds");
        let data = secret.data.expect("data");
        assert!(data.values().all(|v| !String::from_utf8_lossy(&v.0).contains("r3pl")), "{:?}", data.keys());
        let replication = build_replication(&sample(), &pw);
        assert_eq!(replication.metadata.name.as_deref(), Some("production-db-replication"));
        assert_eq!(replication.data.expect("data")[REPLICATION_PASSWORD_KEY].0, b"r3pl");
    }

    #[test]
    fn a_replication_password_from_before_its_own_secret_is_kept() {
        let mut legacy =
            build(&sample(), &Passwords { app: "a".into(), replication: "unused".into() }).expect("builds");
        legacy
            .data
            .get_or_insert_with(Default::default)
            .insert(REPLICATION_PASSWORD_KEY.into(), ByteString(b"old-repl".to_vec()));
        assert_eq!(passwords(Some(&legacy), None).replication, "old-repl");
    }
}
