//! The custom resource types Keelson serves, one file per kind.

pub mod conditions;
pub mod mydatabase;
pub mod webapp;

pub use mydatabase::MyDatabase;
pub use webapp::WebApp;
