//! Keelson: a Kubernetes operator for WebApps and PostgreSQL databases.
//!
//! `api` holds the custom resource types, `webapp` and `mydatabase` one
//! controller each, `instance` the manager beside PostgreSQL in each database
//! pod, `runtime` what both controllers share, `manifests` the CRDs and RBAC
//! generated from this code.

pub mod api;
pub mod error;
pub mod instance;
pub mod manifests;
pub mod mydatabase;
pub mod operator;
pub mod plugin;
pub mod runtime;
pub mod webapp;

pub use error::{Error, Result};
