//! Services: a headless one for stable pod DNS, `-rw` to the primary and
//! `-ro` to the replicas (pods carry a role label the reconciler keeps).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names::{self, PORT, ROLE_LABEL};
use crate::Result;
use crate::api::MyDatabase;

pub const PRIMARY: &str = "primary";
pub const REPLICA: &str = "replica";

fn service(db: &MyDatabase, name: String, selector: BTreeMap<String, String>, headless: bool) -> Result<Service> {
    Ok(Service {
        metadata: names::owned_meta(db, name, "database")?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: headless.then(|| "None".to_string()),
            publish_not_ready_addresses: headless.then_some(true),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("postgresql".into()),
                port: PORT,
                target_port: Some(IntOrString::String("postgresql".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn with_role(db: &MyDatabase, role: &str) -> BTreeMap<String, String> {
    let mut selector = names::pod_selector(db);
    selector.insert(ROLE_LABEL.into(), role.into());
    selector
}

/// The three Services of `db`: headless, read-write, read-only.
pub fn build(db: &MyDatabase) -> Result<[Service; 3]> {
    Ok([
        service(db, names::headless_service(db), names::pod_selector(db), true)?,
        service(db, names::rw_service(db), with_role(db, PRIMARY), false)?,
        service(db, names::ro_service(db), with_role(db, REPLICA), false)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn rw_selects_the_primary_and_ro_the_replicas() {
        let [headless, rw, ro] = build(&sample()).expect("builds");
        assert_eq!(headless.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()), Some("None"));
        let role =
            |s: &Service| s.spec.as_ref().and_then(|s| s.selector.as_ref()).and_then(|s| s.get(ROLE_LABEL).cloned());
        assert_eq!(role(&headless), None);
        assert_eq!(role(&rw).as_deref(), Some("primary"));
        assert_eq!(role(&ro).as_deref(), Some("replica"));
        assert_eq!(rw.metadata.name.as_deref(), Some("production-db-rw"));
    }
}
