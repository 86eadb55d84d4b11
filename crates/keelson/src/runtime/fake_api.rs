//! A fake Kubernetes API for reconcile tests without a cluster: it records
//! every request and answers like the API server would for the few calls the
//! pipeline makes (apply echoes the object, GET of anything unknown is 404),
//! unless a test tells it to refuse or to answer otherwise.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

use super::packed::Packed;
use serde_json::{Value, json};

/// One request the pipeline sent.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Recorded {
    pub fn is_apply(&self) -> bool {
        self.method == "PATCH" && self.content_type.starts_with("application/apply-patch")
    }

    /// The last path segment: the object's name (or `status`).
    pub fn target(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }

    /// Writes to children and status, not Events (published in the background).
    pub fn is_write(&self) -> bool {
        self.method != "GET" && !self.path.contains("/events")
    }
}

struct Rule {
    method: &'static str,
    path_contains: String,
    code: u16,
    body: Value,
}

#[derive(Default)]
struct State {
    requests: Vec<Recorded>,
    rules: Vec<Rule>,
    /// The custom resource under test, returned for its own path.
    primary: Option<(String, Value)>,
}

#[derive(Clone, Default)]
pub struct FakeApi(Arc<Mutex<State>>);

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message})
}

impl FakeApi {
    /// A fake API and a client that talks to it; `primary` answers for its own path.
    pub fn new(primary: &impl serde::Serialize) -> (Self, Client) {
        let value = serde_json::to_value(primary).unwrap_or_default();
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let fake = Self::default();
        lock(&fake.0).primary = Some((name, value));
        let state = fake.0.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(answer(&state, request).await) }
        });
        (fake, Client::new(service, "default"))
    }

    /// Answers `method` on paths containing `path_contains` with `code` and `body`.
    pub fn answer(&self, method: &'static str, path_contains: &str, code: u16, body: Value) {
        lock(&self.0).rules.push(Rule { method, path_contains: path_contains.into(), code, body });
    }

    /// Refuses `method` on paths containing `path_contains`, as the API server would.
    pub fn refuse(&self, method: &'static str, path_contains: &str, code: u16, reason: &str, message: &str) {
        self.answer(method, path_contains, code, status(code, reason, message));
    }

    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.0).requests.clone()
    }

    pub fn writes(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(Recorded::is_write).collect()
    }

    /// Server-side applies, as `<resource>/<name>` in the order sent.
    pub fn applies(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_apply)
            .map(|r| {
                let mut parts = r.path.rsplit('/');
                let name = parts.next().unwrap_or_default().to_string();
                format!("{}/{name}", parts.next().unwrap_or_default())
            })
            .collect()
    }

    /// Status writes, each body shown as `{"status": <the status written>}`.
    pub fn status_writes(&self) -> Vec<Recorded> {
        let mut writes: Vec<Recorded> =
            self.requests().into_iter().filter(|r| r.method == "PATCH" && r.path.ends_with("/status")).collect();
        for write in &mut writes {
            // A JSON patch that sets the whole status.
            if let Some(value) = write.body.get(0).filter(|op| op["path"] == "/status").map(|op| op["value"].clone()) {
                write.body = serde_json::json!({ "status": value });
            }
        }
        writes
    }
}

async fn answer(state: &Mutex<State>, request: Request<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap_or_default();
    let recorded = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    };
    let (code, body) = {
        let mut state = lock(state);
        state.requests.push(recorded.clone());
        let rule = state.rules.iter().find(|r| r.method == recorded.method && recorded.path.contains(&r.path_contains));
        match rule {
            Some(rule) => (rule.code, rule.body.clone()),
            None => default_answer(&state, &recorded),
        }
    };
    let mut response = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *response.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

fn default_answer(state: &State, request: &Recorded) -> (u16, Value) {
    if let Some((name, primary)) = &state.primary {
        let own = request.path.ends_with(&format!("/{name}")) || request.path.ends_with(&format!("/{name}/status"));
        let resource = primary["kind"].as_str().unwrap_or_default().to_lowercase();
        if own && request.path.contains(&format!("/{resource}")) {
            return (200, primary.clone());
        }
    }
    match request.method.as_str() {
        "GET" => (404, status(404, "NotFound", "not found")),
        "DELETE" => (200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})),
        "POST" => (201, request.body.clone()),
        "PATCH" if request.is_apply() => {
            let mut object = request.body.clone();
            object["metadata"]["uid"] = json!(format!("uid-{}", request.target()));
            object["metadata"]["resourceVersion"] = json!("1");
            (200, object)
        }
        _ => (200, json!({"metadata": {"name": request.target()}})),
    }
}

/// A synced cache holding `objects`, as the watches would fill it.
pub fn cache<K>(objects: Vec<K>) -> Store<Packed<K>>
where
    K: kube::Resource<DynamicType = ()>
        + super::packed::LabelsRead
        + serde::Serialize
        + serde::de::DeserializeOwned
        + 'static,
{
    let (store, mut writer) = reflector::store::<Packed<K>>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        let packed = Packed::pack(object).expect("a test object packs");
        writer.apply_watcher_event(&watcher::Event::InitApply(packed));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}
