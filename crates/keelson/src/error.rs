//! The errors a reconcile can end with.

use std::time::Duration;

/// Everything that can go wrong while reconciling a Keelson object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call to {action} failed: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("{0}")]
    MissingMetadata(String),

    #[error("could not serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("finalizer failed: {0}")]
    Finalizer(String),

    #[error("waiting for {0}")]
    Waiting(String),
}

impl Error {
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { source: kube::Error::Api(status), .. } if status.code == 409 => "conflict",
            Error::Kube { .. } => "kube_api",
            Error::MissingMetadata(_) => "missing_metadata",
            Error::Serialize { .. } => "serialize",
            Error::Finalizer(_) => "finalizer",
            Error::Waiting(_) => "waiting",
        }
    }

    /// True for optimistic-concurrency conflicts, which are retried quietly.
    pub fn is_conflict(&self) -> bool {
        self.metric_label() == "conflict"
    }

    /// A fixed delay for errors that are not failures, e.g. waiting for a Job.
    pub fn fixed_retry(&self) -> Option<Duration> {
        match self {
            Error::Waiting(_) => Some(Duration::from_secs(5)),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
