//! Keelson: a Kubernetes operator for WebApps and PostgreSQL databases.
//!
//! `api` holds the custom resource types, `webapp` and `mydatabase` one
//! controller each, `runtime` what both share, `manifests` the CRDs and RBAC
//! generated from this code.

pub mod api;
pub mod error;
pub mod manifests;
pub mod mydatabase;
pub mod operator;
pub mod runtime;
pub mod webapp;

pub use error::{Error, Result};
