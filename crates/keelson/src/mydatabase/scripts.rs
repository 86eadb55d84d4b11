//! The ConfigMap holding the script every database pod and backup Job runs.

use k8s_openapi::api::core::v1::ConfigMap;

use super::names;
use crate::Result;
use crate::api::MyDatabase;

/// The script, shipped in the binary (and tested against real PostgreSQL).
pub const POSTGRES_SCRIPT: &str = include_str!("scripts/keelson-postgres.sh");

pub fn build(db: &MyDatabase) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: names::owned_meta(db, names::scripts(db), "database")?,
        data: Some([(names::SCRIPT.to_string(), POSTGRES_SCRIPT.to_string())].into()),
        ..Default::default()
    })
}
