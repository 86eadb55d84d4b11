//! The errors a reconcile can end with.

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

    #[error("the watch cache of {0} stopped")]
    CacheStopped(&'static str),

    #[error("the watch cache of {0} has not listed them yet")]
    CacheNotSynced(&'static str),

    #[error("the reconcile took longer than {0:?}")]
    TimedOut(std::time::Duration),

    #[error("could not serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// An object of a child's name that is not Keelson's: left untouched.
    #[error("{object} exists and is not Keelson's: {why}; it is left untouched (delete or rename it)")]
    NotOurs { object: String, why: String },

    #[error("could not generate {what}: {reason}")]
    Certificate { what: &'static str, reason: String },

    /// Children the API server refused; the rest were applied and status written.
    #[error("{summary}")]
    ChildrenFailed { summary: String, conflict: bool },
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
            Error::ChildrenFailed { conflict: true, .. } => "conflict",
            Error::Kube { .. } => "kube_api",
            Error::ChildrenFailed { .. } => "child_apply",
            Error::MissingMetadata(_) => "missing_metadata",
            Error::CacheStopped(_) => "cache_stopped",
            Error::CacheNotSynced(_) => "cache_not_synced",
            Error::TimedOut(_) => "timed_out",
            Error::Serialize { .. } => "serialize",
            Error::NotOurs { .. } => "not_ours",
            Error::Certificate { .. } => "certificate",
        }
    }

    /// True for optimistic-concurrency conflicts, which are retried quietly.
    pub fn is_conflict(&self) -> bool {
        self.metric_label() == "conflict"
    }

    /// The object the call was about is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(status), .. } if status.code == 404)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
