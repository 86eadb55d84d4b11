//! Finds where a child object differs from what Keelson wants it to be.
//!
//! The desired object holds only the fields Keelson manages, so "no drift"
//! means: every field of the desired object has the same value in the actual
//! object. Fields the API server or other managers add are ignored.

use kube::Resource;
use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};

/// One managed field whose actual value differs from the desired one.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldDrift {
    /// Path such as `spec.template.spec.containers[webapp].image`.
    pub path: String,
    pub desired: Value,
    pub actual: Value,
}

impl FieldDrift {
    /// True for a field inside an entry of a list of objects, e.g. `spec.ports[http].port`.
    pub fn in_list_entry(&self) -> bool {
        self.path.contains('[')
    }

    /// True for a changed replica count (`kubectl scale`, an autoscaler), the drift
    /// a one-field patch can take back: every builder sets `spec.replicas` on every apply.
    pub fn is_replica_count(&self) -> bool {
        self.path == "spec.replicas"
    }

    /// The path without list keys, a bounded label for metrics.
    pub fn field(&self) -> String {
        let mut out = String::with_capacity(self.path.len());
        let mut depth = 0;
        for ch in self.path.chars() {
            match ch {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ if depth == 0 => out.push(ch),
                _ => {}
            }
        }
        out
    }
}

/// Lists every managed field of `desired` that `actual` does not match.
pub fn diff(desired: &Value, actual: &Value) -> Vec<FieldDrift> {
    let mut drifts = Vec::new();
    walk(desired, actual, String::new(), &mut drifts);
    drifts
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn walk(desired: &Value, actual: &Value, path: String, out: &mut Vec<FieldDrift>) {
    match (desired, actual) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, want_value) in want {
                let child_path = join(&path, key);
                match have.get(key) {
                    Some(have_value) => walk(want_value, have_value, child_path, out),
                    // The API server omits empty values: wanting one is having it.
                    None if omitted_when_empty(want_value) => {}
                    None => out.push(FieldDrift { path: child_path, desired: want_value.clone(), actual: Value::Null }),
                }
            }
        }
        (Value::Array(want), Value::Array(have)) => walk_list(want, have, &path, out),
        (want, have) if want == have || numbers_equal(want, have) || quantities_equal(want, have) => {}
        (want, have) => out.push(FieldDrift { path, desired: want.clone(), actual: have.clone() }),
    }
}

fn omitted_when_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

fn numbers_equal(a: &Value, b: &Value) -> bool {
    matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y)
}

/// The API server rewrites quantities in canonical form (`1.5Gi` becomes `1536Mi`).
fn quantities_equal(a: &Value, b: &Value) -> bool {
    match (a.as_str().and_then(parse_quantity), b.as_str().and_then(parse_quantity)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(1.0),
        _ => false,
    }
}

/// Value of a Kubernetes quantity such as `100Gi`, `500m` or `1e3`; None for other strings.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

/// Keys by which Kubernetes merges list elements, in the order we try them.
const LIST_KEYS: &[&str] = &["name", "uid", "containerPort", "port", "key", "mountPath"];

fn list_key(element: &Value) -> Option<(&'static str, &Value)> {
    LIST_KEYS.iter().find_map(|k| element.get(*k).map(|v| (*k, v)))
}

fn walk_list(want: &[Value], have: &[Value], path: &str, out: &mut Vec<FieldDrift>) {
    // Lists of scalars are atomic in Kubernetes: they must match exactly.
    if want.iter().all(|v| !v.is_object()) {
        if want != have {
            out.push(FieldDrift {
                path: path.to_string(),
                desired: Value::Array(want.to_vec()),
                actual: Value::Array(have.to_vec()),
            });
        }
        return;
    }
    for (index, element) in want.iter().enumerate() {
        match list_key(element) {
            Some((key, value)) => {
                let label = value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
                let element_path = format!("{path}[{label}]");
                match have.iter().find(|h| h.get(key) == Some(value)) {
                    Some(found) => walk(element, found, element_path, out),
                    None => out.push(FieldDrift { path: element_path, desired: element.clone(), actual: Value::Null }),
                }
            }
            None => {
                let element_path = format!("{path}[{index}]");
                match have.get(index) {
                    Some(found) => walk(element, found, element_path, out),
                    None => out.push(FieldDrift { path: element_path, desired: element.clone(), actual: Value::Null }),
                }
            }
        }
    }
}

/// Annotation holding a hash of what Keelson last applied, so a spec change
/// (ours) can be told apart from drift (someone else's).
pub const DESIRED_HASH_ANNOTATION: &str = "keelson.dev/desired-hash";

/// What applying a child did.
#[derive(Debug, PartialEq)]
pub enum ChildChange {
    Unchanged,
    Created,
    /// The spec asked for something new.
    Updated(Vec<FieldDrift>),
    /// Someone else changed fields Keelson manages; they were set back.
    DriftCorrected(Vec<FieldDrift>),
}

/// 64-bit FNV-1a: stable across builds, unlike `std`'s hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100000001b3))
}

/// A stable hash of `value`'s JSON, as 16 hex digits.
pub fn content_hash<T: Serialize>(value: &T, what: &'static str) -> Result<String> {
    let json = serde_json::to_vec(value).map_err(|source| Error::Serialize { what, source })?;
    Ok(format!("{:016x}", fnv1a(&json)))
}

/// Stamps `desired` with the hash of its own content.
pub fn stamp_desired_hash<K: Resource + Serialize>(desired: &mut K) -> Result<()> {
    let hash = content_hash(desired, "desired child")?;
    desired.meta_mut().annotations.get_or_insert_with(Default::default).insert(DESIRED_HASH_ANNOTATION.into(), hash);
    Ok(())
}

fn desired_hash<K: Resource>(object: &K) -> Option<&String> {
    object.meta().annotations.as_ref().and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
}

/// Compares `actual` to `desired` (already stamped) and says what applying would be.
pub fn classify<K: Resource + Serialize>(desired: &K, actual: Option<&K>) -> Result<ChildChange> {
    let Some(actual) = actual else {
        return Ok(ChildChange::Created);
    };
    let want = serde_json::to_value(desired).map_err(|source| Error::Serialize { what: "desired child", source })?;
    let have = serde_json::to_value(actual).map_err(|source| Error::Serialize { what: "actual child", source })?;
    let drifts = diff(&want, &have);
    Ok(if drifts.is_empty() {
        ChildChange::Unchanged
    } else if desired_hash(actual) == desired_hash(desired) {
        ChildChange::DriftCorrected(drifts)
    } else {
        ChildChange::Updated(drifts)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use serde_json::json;

    #[test]
    fn fields_added_by_others_are_not_drift() {
        let desired = json!({"spec": {"replicas": 3, "ports": [{"port": 80}]}});
        let actual = json!({"spec": {"replicas": 3, "paused": false, "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}});
        assert!(diff(&desired, &actual).is_empty());
    }

    #[test]
    fn changed_scalar_is_reported_with_both_values() {
        let desired = json!({"spec": {"replicas": 3}});
        let actual = json!({"spec": {"replicas": 10}});
        let drifts = diff(&desired, &actual);
        assert_eq!(drifts, vec![FieldDrift { path: "spec.replicas".into(), desired: json!(3), actual: json!(10) }]);
    }

    #[test]
    fn keyed_list_elements_are_matched_by_name() {
        let desired = json!({"containers": [{"name": "webapp", "image": "nginx:1.25"}]});
        let actual =
            json!({"containers": [{"name": "sidecar", "image": "x"}, {"name": "webapp", "image": "nginx:1.26"}]});
        let drifts = diff(&desired, &actual);
        assert_eq!(drifts.len(), 1);
        assert_eq!(drifts[0].path, "containers[webapp].image");
        assert_eq!(drifts[0].field(), "containers.image");
        assert_eq!(drifts[0].actual, json!("nginx:1.26"));
    }

    #[test]
    fn missing_field_and_missing_element_are_drift() {
        let desired = json!({"metadata": {"labels": {"app": "a"}}, "ports": [{"port": 80}]});
        let actual = json!({"metadata": {}, "ports": [{"port": 8080}]});
        let paths: Vec<_> = diff(&desired, &actual).into_iter().map(|d| d.path).collect();
        assert_eq!(paths, vec!["metadata.labels", "ports[80]"]);
    }

    #[test]
    fn empty_values_the_api_server_omits_are_not_drift() {
        // An env var `value: ""` comes back without `value`: a write would change nothing, forever.
        let desired = json!({"env": [{"name": "EMPTY", "value": ""}], "labels": {}, "args": []});
        assert!(diff(&desired, &json!({"env": [{"name": "EMPTY"}]})).is_empty());
        assert_eq!(
            diff(&json!({"env": [{"name": "SET", "value": ""}]}), &json!({"env": [{"name": "SET", "value": "x"}]}))
                .len(),
            1
        );
    }

    #[test]
    fn scalar_lists_must_match_exactly() {
        assert!(diff(&json!({"args": ["a"]}), &json!({"args": ["a"]})).is_empty());
        assert_eq!(diff(&json!({"args": ["a"]}), &json!({"args": ["a", "b"]})).len(), 1);
    }

    #[test]
    fn canonical_quantities_match() {
        assert!(diff(&json!({"storage": "1.5Gi"}), &json!({"storage": "1536Mi"})).is_empty());
        assert_eq!(diff(&json!({"storage": "2Gi"}), &json!({"storage": "1Gi"})).len(), 1);
        assert_eq!(parse_quantity("100Gi"), Some(107374182400.0));
        assert_eq!(parse_quantity("nginx:1.25"), None);
    }

    #[test]
    fn integer_and_float_forms_of_a_number_match() {
        assert!(diff(&json!({"n": 1}), &json!({"n": 1.0})).is_empty());
    }

    fn config_map(value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some("c".into()), ..Default::default() },
            data: Some([("k".to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    fn stamped(value: &str) -> ConfigMap {
        let mut cm = config_map(value);
        stamp_desired_hash(&mut cm).expect("serializable");
        cm
    }

    #[test]
    fn missing_child_is_created() {
        assert_eq!(classify(&stamped("a"), None).expect("ok"), ChildChange::Created);
    }

    #[test]
    fn equal_child_is_unchanged() {
        let desired = stamped("a");
        assert_eq!(classify(&desired, Some(&desired.clone())).expect("ok"), ChildChange::Unchanged);
    }

    #[test]
    fn outside_edit_is_drift_and_spec_change_is_update() {
        let desired = stamped("a");
        let mut edited = desired.clone();
        edited.data = Some([("k".to_string(), "b".to_string())].into());
        assert!(
            matches!(classify(&desired, Some(&edited)).expect("ok"), ChildChange::DriftCorrected(d) if d[0].path == "data.k")
        );
        let new_desired = stamped("c");
        assert!(matches!(classify(&new_desired, Some(&desired)).expect("ok"), ChildChange::Updated(_)));
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(stamped("a").metadata.annotations, stamped("a").metadata.annotations);
        assert_ne!(stamped("a").metadata.annotations, stamped("b").metadata.annotations);
    }
}
