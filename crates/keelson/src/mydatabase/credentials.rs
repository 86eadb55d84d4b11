//! The Secret with the database's credentials and connection details.
//! Passwords are generated once and then read back, never rotated silently.
//! It belongs to no owner: the deletion policy decides its fate.

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

/// The passwords already in `existing`, or new random ones for what is missing.
pub fn passwords(existing: Option<&Secret>) -> Passwords {
    let read = |key: &str| {
        existing
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|v| !v.is_empty())
    };
    Passwords {
        app: read(PASSWORD_KEY).unwrap_or_else(random_password),
        replication: read(REPLICATION_PASSWORD_KEY).unwrap_or_else(random_password),
    }
}

/// Builds the Secret `<name>-credentials`: what an application needs to connect.
pub fn build(db: &MyDatabase, passwords: &Passwords) -> Result<Secret> {
    let namespace = db.namespace().unwrap_or_default();
    let host = format!("{}.{namespace}.svc", names::rw_service(db));
    let uri = format!("postgresql://{APP_USER}:{}@{host}:{PORT}/{APP_DB}", passwords.app);
    let data: BTreeMap<String, ByteString> = [
        ("username", APP_USER.to_string()),
        (PASSWORD_KEY, passwords.app.clone()),
        (REPLICATION_PASSWORD_KEY, passwords.replication.clone()),
        ("database", APP_DB.to_string()),
        ("host", host),
        ("port", PORT.to_string()),
        ("uri", uri),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn passwords_are_random_and_then_kept() {
        let first = passwords(None);
        assert_eq!(first.app.len(), 32);
        assert_ne!(first.app, first.replication);
        assert_ne!(passwords(None).app, first.app);
        let secret = build(&sample(), &first).expect("builds");
        assert_eq!(passwords(Some(&secret)), first);
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
        assert!(!format!("{pw:?}").contains("s3cret"));
    }
}
