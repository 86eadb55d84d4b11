//! The custom resource types Keelson serves, one file per kind.

// kube-derive takes repeated `printcolumn(type_ = ...)` arguments, which this
// lint mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
pub mod instance;
pub mod mydatabase;
pub mod parameters;
pub mod reference;
pub mod webapp;

pub use mydatabase::MyDatabase;
pub use webapp::WebApp;
