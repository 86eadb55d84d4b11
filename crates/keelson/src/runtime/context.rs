//! State shared by every reconcile of both controllers: the client, metrics,
//! Events, settings, and what this process remembers between reconciles
//! (`status_writes`, `own_writes`, `backoff`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::backoff::Backoff;
use super::metrics::Metrics;
use super::own_writes::OwnWrites;
use super::status_writes::StatusWrites;

/// The field manager every server-side apply of Keelson uses.
pub const FIELD_MANAGER: &str = "keelson";

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub backoff: Backoff,
    pub settings: Settings,
    /// The resourceVersion each child had after our last write to it.
    pub own_writes: OwnWrites,
    /// When this process last wrote each object's status.
    pub status_writes: StatusWrites,
}

/// What the operator's flags say about the objects it builds.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The image MyDatabase pods copy the instance manager from: the operator's own.
    pub instance_image: String,
    /// Watches receive their initial lists as streams (the API server supports it).
    pub streaming_lists: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self { instance_image: concat!("keelson:", env!("CARGO_PKG_VERSION")).into(), streaming_lists: false }
    }
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Arc<Self> {
        let reporter = Reporter { controller: "keelson".into(), instance: std::env::var("POD_NAME").ok() };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            backoff: Backoff::default(),
            settings,
            own_writes: OwnWrites::default(),
            status_writes: StatusWrites::default(),
        })
    }

    /// Forgets what this process kept about an object that is gone (deleted,
    /// or never seen): its status writes, its children's versions, its backoff.
    /// Forgetting a live object is safe: its next status is written again, its
    /// children are read before they are written, its next failure starts anew.
    pub fn forget_object(&self, controller: &str, kind: &str, namespace: Option<&str>, name: &str) {
        use super::meta::key;
        let object = key(kind, namespace, name);
        self.status_writes.forget(&key(controller, namespace, name));
        self.own_writes.forget_owner(&object);
        self.backoff.reset(&object);
    }

    /// Publishes an Event on `regarding` in the background, off the reconcile's
    /// critical path; a failure to publish is logged, never fatal.
    pub async fn event(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
        let (recorder, regarding) = (self.recorder.clone(), regarding.clone());
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &regarding).await {
                tracing::warn!(%error, reason = %event.reason, "could not publish event");
            }
        });
    }
}
