//! Least privilege, proven from the API server's audit log: every right the
//! generated ClusterRole grants was used by the operators of the other
//! integration tests (each runs as a ServiceAccount bound to exactly that
//! role, so a right they lack fails them). `make test` runs this last, over
//! the whole suite's traffic: `cargo test --test rbac_audit -- --ignored`.

use std::collections::BTreeSet;
use std::io::BufRead;

use keelson::manifests::rbac::{cluster_role, metrics_auth_role, node_reader_role};
use testkit::control_plane::ControlPlane;

/// Rights checked by admission, not requested: OwnerReferencesPermissionEnforcement
/// (on in the dev cluster) asks for them when children block their owner's deletion.
const CHECKED_BY_ADMISSION: &[(&str, &str, &str)] =
    &[("apps.keelson.dev", "webapps/finalizers", "update"), ("db.keelson.dev", "mydatabases/finalizers", "update")];

#[test]
#[ignore = "runs after the whole suite (make test), over its audit log"]
fn every_granted_right_was_used_by_the_suite() -> anyhow::Result<()> {
    let Some(plane) = ControlPlane::of_kubeconfig() else {
        anyhow::bail!("needs the dev cluster's audit log (make test)");
    };
    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    let files = plane.audit_logs().into_iter().map(std::fs::File::open).collect::<Result<Vec<_>, _>>()?;
    for line in files.into_iter().flat_map(|file| std::io::BufReader::new(file).lines()) {
        let event: serde_json::Value = serde_json::from_str(&line?)?;
        // In-process test operators impersonate their ServiceAccount; binaries log in as it.
        let user =
            event["impersonatedUser"]["username"].as_str().or(event["user"]["username"].as_str()).unwrap_or_default();
        if !(user.starts_with("system:serviceaccount:") && user.ends_with(":keelson")) {
            continue;
        }
        let object = &event["objectRef"];
        let (Some(resource), Some(verb)) = (object["resource"].as_str(), event["verb"].as_str()) else { continue };
        let resource = match object["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        let group = object["apiGroup"].as_str().unwrap_or_default().to_string();
        used.insert((group.clone(), resource.clone(), verb.to_string()));
        // A watch that streams its initial list (WatchList, where the API server supports it)
        // does the list's work; `list` stays granted for servers without it, which are listed.
        let uri = event["requestURI"].as_str().unwrap_or_default();
        if verb == "watch" && uri.contains("sendInitialEvents=true") {
            used.insert((group.clone(), resource.clone(), "list".to_string()));
        }
        // Server-side apply of a new object is a patch that needs `create` too.
        if verb == "patch" && event["responseStatus"]["code"] == 201 {
            used.insert((group, resource, "create".to_string()));
        }
    }
    anyhow::ensure!(!used.is_empty(), "no request of a test operator in {}", plane.audit_log().display());
    let mut unused = Vec::new();
    let granted =
        [cluster_role(), node_reader_role(), metrics_auth_role()].into_iter().flat_map(|role| role.rules).flatten();
    for rule in granted {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    let right = (group.clone(), resource.clone(), verb.clone());
                    let by_admission =
                        CHECKED_BY_ADMISSION.iter().any(|(g, r, v)| (*g, *r, *v) == (group, resource, verb));
                    if !used.contains(&right) && !by_admission {
                        unused.push(format!("{verb} {resource}{}", if group.is_empty() { "" } else { "." }) + group);
                    }
                }
            }
        }
    }
    anyhow::ensure!(unused.is_empty(), "granted but never used by the suite: {unused:?}\nused: {used:?}");
    Ok(())
}
