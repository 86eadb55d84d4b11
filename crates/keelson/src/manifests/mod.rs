//! Manifests generated from the Rust types: CRDs now, RBAC and deployment
//! objects beside them. Nothing here is written by hand in YAML.

pub mod crd;
pub mod rbac;

use serde::Serialize;

use crate::{Error, Result};

/// Renders objects as one multi-document YAML stream.
pub fn to_yaml_stream<T: Serialize>(objects: &[T]) -> Result<String> {
    let mut out = String::new();
    for object in objects {
        let value = serde_json::to_value(object).map_err(|source| Error::Serialize { what: "manifest", source })?;
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&value).unwrap_or_default());
    }
    Ok(out)
}
