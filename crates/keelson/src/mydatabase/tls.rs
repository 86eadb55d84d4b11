//! TLS for every connection to a database. A CA of its own (`<name>-ca`,
//! read by the operator only) signs the certificate the instances present
//! (`<name>-server`), for the `-rw`/`-ro` Services and the pods' DNS names.
//! Applications verify it with `ca.crt` from the credentials Secret
//! (`sslmode=verify-full`); replicas verify their primary against the same CA.
//! The server certificate lives 90 days and is renewed 30 days ahead; the
//! instances reload it without a restart (`keelson-postgres.sh`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Secret};
use kube::ResourceExt;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};

use super::names;
use super::secret_data::{data, read};
use crate::api::MyDatabase;
use crate::api::mydatabase::SERVER_CERTIFICATE_FOR_LABEL;
use crate::runtime::Invalid;
use crate::{Error, Result};

pub const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";
/// When the server certificate expires (RFC 3339), so that renewal needs no X.509 parsing.
pub const NOT_AFTER_ANNOTATION: &str = "keelson.dev/not-after";

const CA_VALIDITY: chrono::Duration = chrono::Duration::days(3650);
pub const SERVER_VALIDITY: chrono::Duration = chrono::Duration::days(90);
pub const RENEW_BEFORE: chrono::Duration = chrono::Duration::days(30);

/// The CA and the server certificate, PEM-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificates {
    pub ca_cert: String,
    ca_key: String,
    pub server_cert: String,
    server_key: String,
    pub server_not_after: DateTime<Utc>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Certificates(not after {}, keys redacted)", self.server_not_after.to_rfc3339())
    }
}

fn failed(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Certificate { what, reason: source.to_string() }
}

/// The names clients reach the database by: the Services, short and
/// qualified, and each pod through the headless Service.
pub fn dns_names(db: &MyDatabase) -> Vec<String> {
    let namespace = db.namespace().unwrap_or_default();
    let qualified = |name: &str| {
        let full = format!("{name}.{namespace}");
        vec![name.to_string(), full.clone(), format!("{full}.svc"), format!("{full}.svc.cluster.local")]
    };
    [names::rw_service(db), names::ro_service(db), format!("*.{}", names::headless_service(db))]
        .iter()
        .flat_map(|name| qualified(name))
        .collect()
}

/// The CA's parameters: the same every time, so that a CA read back from its
/// Secret signs as the one first generated (subject and key identifier).
fn ca_params(db: &MyDatabase) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, "Keelson");
    params.distinguished_name.push(
        DnType::CommonName,
        format!("Keelson CA for MyDatabase {}/{}", db.namespace().unwrap_or_default(), db.name_any()),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn offset(time: DateTime<Utc>) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(time.timestamp())
        .map_err(|source| Error::Certificate { what: "a validity period", reason: source.to_string() })
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive and not zero-led: some parsers refuse anything else.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

fn new_ca(db: &MyDatabase, now: DateTime<Utc>) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(failed("the CA key"))?;
    let mut params = ca_params(db);
    params.not_before = offset(now - chrono::Duration::hours(1))?;
    params.not_after = offset(now + CA_VALIDITY)?;
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key).map_err(failed("the CA certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn new_server(db: &MyDatabase, ca_key: &str, now: DateTime<Utc>) -> Result<(String, String, DateTime<Utc>)> {
    let issuer = Issuer::new(ca_params(db), KeyPair::from_pem(ca_key).map_err(failed("the CA key"))?);
    let key = KeyPair::generate().map_err(failed("the server key"))?;
    let mut params = CertificateParams::new(dns_names(db)).map_err(failed("the server's names"))?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, "Keelson");
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{}.{}.svc", names::rw_service(db), db.namespace().unwrap_or_default()));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let not_after = now + SERVER_VALIDITY;
    params.not_before = offset(now - chrono::Duration::hours(1))?;
    params.not_after = offset(not_after)?;
    params.serial_number = Some(random_serial());
    let cert = params.signed_by(&key, &issuer).map_err(failed("the server certificate"))?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

/// The certificates in the Secrets where they are still good, new ones for
/// what is missing: a new CA only when there is none (a new one would break
/// every client that trusts the old), a new server certificate when there is
/// none, it is due for renewal, or another CA signed it.
pub fn certificates(
    db: &MyDatabase,
    ca: Option<&Secret>,
    server: Option<&Secret>,
    now: DateTime<Utc>,
) -> Result<Certificates> {
    let (ca_cert, ca_key) = match (ca, read(ca, CA_CERT_KEY), read(ca, CA_KEY_KEY)) {
        (None, _, _) => new_ca(db, now)?,
        (Some(_), Some(cert), Some(key)) if KeyPair::from_pem(&key).is_ok() => (cert, key),
        // Never replaced on its own: every client trusts this CA, and a new one would lock them out.
        (Some(_), _, _) => {
            return Err(Error::Certificate {
                what: "the server certificate",
                reason: format!(
                    "the CA Secret {} lacks a {CA_CERT_KEY} or a readable {CA_KEY_KEY}; restore them, or delete \
                     the Secret for a new CA (clients must then take the new {CA_CERT_KEY})",
                    names::ca_secret(db)
                ),
            });
        }
    };
    let not_after = server
        .and_then(|s| s.annotations().get(NOT_AFTER_ANNOTATION))
        .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
        .map(|at| at.with_timezone(&Utc));
    let current = match (read(server, TLS_CERT_KEY), read(server, TLS_KEY_KEY), not_after) {
        (Some(cert), Some(key), Some(not_after))
            if read(server, CA_CERT_KEY).as_deref() == Some(ca_cert.as_str()) && now < not_after - RENEW_BEFORE =>
        {
            Some((cert, key, not_after))
        }
        _ => None,
    };
    let (server_cert, server_key, server_not_after) = match current {
        Some(current) => current,
        None => new_server(db, &ca_key, now)?,
    };
    Ok(Certificates { ca_cert, ca_key, server_cert, server_key, server_not_after })
}

/// Whether every instance presents the certificate: no StatefulSet yet (a new
/// database), or its template and every pod mount it. Until then (a database
/// from before TLS being rolled onto it) clients are not told to verify it.
pub fn served(statefulset: Option<&StatefulSet>, pods: &[Pod]) -> bool {
    let mounts =
        |spec: Option<&PodSpec>| spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| v.name == VOLUME);
    let Some(statefulset) = statefulset else { return true };
    mounts(statefulset.spec.as_ref().and_then(|s| s.template.spec.as_ref()))
        && pods.iter().all(|p| mounts(p.spec.as_ref()))
}

/// The name of the instances' volume of `<name>-server`.
pub const VOLUME: &str = "server-tls";

/// The Secret the instances present: the user's (`spec.tls.serverSecret`), else Keelson's.
pub fn server_secret_name(db: &MyDatabase) -> String {
    match &db.spec.tls {
        Some(tls) => tls.server_secret.clone(),
        None => names::server_secret(db),
    }
}

/// With `spec.tls.serverSecret`: the Secret's `ca.crt`, once it exists, names
/// this database in its label, and holds all three files.
pub fn user_certificate(db: &MyDatabase, secret: Option<&Secret>) -> Result<Option<String>, Invalid> {
    let Some(tls) = &db.spec.tls else { return Ok(None) };
    let name = &tls.server_secret;
    let invalid = |reason: &'static str, why: String| Invalid {
        field: "spec.tls.serverSecret",
        reason,
        message: format!("spec.tls.serverSecret {name:?}: {why}"),
    };
    let Some(secret) = secret else {
        return Err(invalid("ServerSecretMissing", "no such Secret in this namespace (yet)".into()));
    };
    if secret.labels().get(SERVER_CERTIFICATE_FOR_LABEL) != Some(&db.name_any()) {
        let why = format!("the Secret lacks the label {SERVER_CERTIFICATE_FOR_LABEL}: {}", db.name_any());
        return Err(invalid("ServerSecretNotAllowed", why));
    }
    let missing: Vec<&str> =
        [TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY].into_iter().filter(|key| read(Some(secret), key).is_none()).collect();
    match read(Some(secret), CA_CERT_KEY) {
        Some(ca_cert) if missing.is_empty() => Ok(Some(ca_cert)),
        _ => Err(invalid("ServerSecretIncomplete", format!("the Secret has no {}", missing.join(", ")))),
    }
}

/// How long until the server certificate is due for renewal.
pub fn renewal_in(certificates: &Certificates, now: DateTime<Utc>) -> Duration {
    (certificates.server_not_after - RENEW_BEFORE - now).to_std().unwrap_or_default()
}

/// `<name>-ca`: the CA's certificate and key, for the operator alone. Not
/// owned: clients trust this CA for as long as the database's data lives
/// (the deletion policy decides, as for the credentials).
pub fn build_ca(db: &MyDatabase, certificates: &Certificates) -> Secret {
    Secret {
        metadata: names::unowned_meta(db, names::ca_secret(db), "tls"),
        type_: Some("Opaque".into()),
        data: Some(data(&[(CA_CERT_KEY, &certificates.ca_cert), (CA_KEY_KEY, &certificates.ca_key)])),
        ..Default::default()
    }
}

/// `<name>-server`: what the instances present, in the layout of
/// `kubernetes.io/tls` Secrets (as cert-manager writes them).
pub fn build_server(db: &MyDatabase, certificates: &Certificates) -> Result<Secret> {
    let mut metadata = names::owned_meta(db, names::server_secret(db), "tls")?;
    metadata.annotations =
        Some([(NOT_AFTER_ANNOTATION.to_string(), certificates.server_not_after.to_rfc3339())].into());
    Ok(Secret {
        metadata,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data(&[
            (TLS_CERT_KEY, &certificates.server_cert),
            (TLS_KEY_KEY, &certificates.server_key),
            (CA_CERT_KEY, &certificates.ca_cert),
        ])),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).expect("a time").with_timezone(&Utc)
    }

    #[test]
    fn new_certificates_name_the_services_and_pods() {
        let now = at("2026-12-06T10:00:00Z");
        let certs = certificates(&sample(), None, None, now).expect("generates");
        assert!(certs.ca_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(certs.server_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(certs.server_not_after, now + SERVER_VALIDITY);
        assert_eq!(renewal_in(&certs, now), (SERVER_VALIDITY - RENEW_BEFORE).to_std().expect("positive"));
        let names = dns_names(&sample());
        for name in [
            "production-db-rw",
            "production-db-rw.default.svc",
            "production-db-ro.default.svc.cluster.local",
            "*.production-db-headless",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert!(!format!("{certs:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn certificates_are_kept_until_renewal_is_due() {
        let db = sample();
        let issued = at("2026-12-06T10:00:00Z");
        let certs = certificates(&db, None, None, issued).expect("generates");
        let ca = build_ca(&db, &certs);
        let server = build_server(&db, &certs).expect("builds");
        let later = issued + chrono::Duration::days(59);
        assert_eq!(certificates(&db, Some(&ca), Some(&server), later).expect("reads"), certs);

        let due = issued + chrono::Duration::days(61);
        let renewed = certificates(&db, Some(&ca), Some(&server), due).expect("renews");
        assert_eq!(renewed.ca_cert, certs.ca_cert, "renewal keeps the CA clients trust");
        assert_ne!(renewed.server_cert, certs.server_cert);
        assert_eq!(renewed.server_not_after, due + SERVER_VALIDITY);
    }

    #[test]
    fn a_server_certificate_of_another_ca_is_replaced() {
        let db = sample();
        let now = at("2026-12-06T10:00:00Z");
        let first = certificates(&db, None, None, now).expect("generates");
        let server = build_server(&db, &first).expect("builds");
        // The CA Secret was deleted: a new CA, and a server certificate it signed.
        let second = certificates(&db, None, Some(&server), now).expect("generates");
        assert_ne!(second.ca_cert, first.ca_cert);
        assert_ne!(second.server_cert, first.server_cert);
    }

    #[test]
    fn a_damaged_ca_is_never_replaced_on_its_own() {
        let db = sample();
        let now = at("2026-12-06T10:00:00Z");
        let certs = certificates(&db, None, None, now).expect("generates");
        let mut ca = build_ca(&db, &certs);
        ca.data.get_or_insert_with(Default::default).remove(CA_KEY_KEY);
        let refused = certificates(&db, Some(&ca), None, now).expect_err("a new CA over the old one");
        assert!(refused.to_string().contains("production-db-ca lacks"), "{refused}");
    }

    #[test]
    fn clients_verify_once_every_instance_presents_the_certificate() {
        use crate::mydatabase::statefulset;
        use crate::runtime::Settings;
        assert!(served(None, &[]), "a new database starts with TLS");
        let sts = statefulset::build(&sample(), &Settings::default()).expect("builds");
        let with_tls = Pod { spec: sts.spec.as_ref().and_then(|s| s.template.spec.clone()), ..Default::default() };
        assert!(served(Some(&sts), &[with_tls.clone(), with_tls.clone()]));
        assert!(!served(Some(&sts), &[with_tls, Pod::default()]), "a pod from before TLS");
    }

    #[test]
    fn a_users_certificate_is_taken_only_when_its_secret_names_this_database() {
        use crate::api::mydatabase::TlsSpec;
        let mut db = sample();
        assert_eq!(user_certificate(&db, None), Ok(None), "Keelson's own by default");
        db.spec.tls = Some(TlsSpec { server_secret: "company-cert".into() });
        assert_eq!(server_secret_name(&db), "company-cert");
        let reason = |secret: Option<&Secret>| user_certificate(&db, secret).map_err(|i| i.reason);
        assert_eq!(reason(None), Err("ServerSecretMissing"));
        let certs = certificates(&db, None, None, at("2026-12-06T10:00:00Z")).expect("generates");
        let mut secret = build_server(&db, &certs).expect("builds");
        assert_eq!(reason(Some(&secret)), Err("ServerSecretNotAllowed"), "another database's Secret");
        secret.metadata.labels = Some([(SERVER_CERTIFICATE_FOR_LABEL.to_string(), "production-db".to_string())].into());
        assert_eq!(user_certificate(&db, Some(&secret)), Ok(Some(certs.ca_cert.clone())));
        secret.data.get_or_insert_with(Default::default).remove(TLS_KEY_KEY);
        let incomplete = user_certificate(&db, Some(&secret)).expect_err("no key");
        assert_eq!(incomplete.message, "spec.tls.serverSecret \"company-cert\": the Secret has no tls.key");
    }

    #[test]
    fn secrets_have_their_audiences_layout() {
        let db = sample();
        let certs = certificates(&db, None, None, at("2026-12-06T10:00:00Z")).expect("generates");
        let ca = build_ca(&db, &certs);
        assert_eq!(ca.metadata.name.as_deref(), Some("production-db-ca"));
        assert!(ca.metadata.owner_references.is_none(), "the CA outlives the database as its data does");
        let server = build_server(&db, &certs).expect("builds");
        assert_eq!(server.metadata.name.as_deref(), Some("production-db-server"));
        assert_eq!(server.type_.as_deref(), Some("kubernetes.io/tls"));
        let keys: Vec<&String> = server.data.as_ref().expect("data").keys().collect();
        assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
        assert_eq!(server.metadata.annotations.expect("annotated")[NOT_AFTER_ANNOTATION], "2027-03-06T10:00:00+00:00");
    }
}
