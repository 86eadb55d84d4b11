//! The committed `config/` tree is exactly what the code generates.

#[test]
fn committed_manifests_are_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = keelson::manifests::files().expect("manifests render");
    let mut stale = Vec::new();
    for (path, expected) in &files {
        match std::fs::read_to_string(root.join(path)) {
            Ok(actual) if &actual == expected => {}
            Ok(_) => stale.push(format!("{path} differs")),
            Err(_) => stale.push(format!("{path} is missing")),
        }
    }
    assert!(stale.is_empty(), "generated manifests are stale; run `make manifests`:\n{}", stale.join("\n"));
}
