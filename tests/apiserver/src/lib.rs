//! TEST INFRASTRUCTURE ONLY, never part of the product: an in-memory Kubernetes API server on
//! 127.0.0.1 that speaks enough of the REST and watch protocol for unmodified `kube::Client` code
//! (kube 5, k8s-openapi 0.29) to run against it.
//!
//! What it serves (see `resources::RESOURCES`): core/v1 services, pods, endpoints, nodes, namespaces,
//! configmaps, events; discovery.k8s.io/v1 endpointslices; coordination.k8s.io/v1 leases; apps/v1 and
//! batch/v1 workloads. Discovery documents for all of them.
//!
//! Semantics kept: list with resourceVersion and label/field selectors, paginated with `limit` and
//! `continue` from one snapshot per listing;
//! watch from a resourceVersion (JSON lines), bookmarks, `sendInitialEvents`, an ERROR event with
//! code 410 when the version is older than the bounded history; create with generateName, uid,
//! creationTimestamp, generation, resourceVersion, 409 AlreadyExists; update with 409 on a stale
//! resourceVersion; merge, strategic merge (approximation, see `patch`), JSON and apply patches (apply
//! approximated as a merge that creates); delete with finalizers (deletionTimestamp first, removal
//! when the last finalizer goes); status and `pods/binding` subresources; status reset on create for
//! Pods and Services as the real strategies do; Service clusterIP and nodePort allocation.
//!
//! Not kept: authentication, admission, validation of field contents, garbage collection of
//! dependents (ownerReferences are stored as written and nothing acts on them), field managers,
//! graceful Pod deletion (Pods without finalizers go at once).
//!
//! Faults: `FaultHandle` fails requests with 500, stalls them, drops all open watches, or forbids
//! a resource type (403, as a missing RBAC rule would).

mod fault;
mod http;
pub mod patch;
pub mod resources;
pub mod selector;
pub mod store;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;

pub use fault::FaultHandle;
pub use store::ServiceCidr;

/// Errors of the test API server; each maps to a Kubernetes `Status` with the matching code/reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 400 BadRequest.
    #[error("{0}")]
    BadRequest(String),
    /// 403 Forbidden.
    #[error("{0}")]
    Forbidden(String),
    /// 404 NotFound.
    #[error("{0}")]
    NotFound(String),
    /// 405 MethodNotAllowed.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 409 AlreadyExists.
    #[error("{0}")]
    AlreadyExists(String),
    /// 409 Conflict.
    #[error("{0}")]
    Conflict(String),
    /// 410 Gone (reason Expired).
    #[error("{0}")]
    Gone(String),
    /// 415 UnsupportedMediaType.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422 Invalid.
    #[error("{0}")]
    Invalid(String),
    /// 500 InternalError.
    #[error("{0}")]
    Internal(String),
    /// Starting the server or writing a file failed.
    #[error("test API server {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Building a kube client failed.
    #[error("test API server client: {0}")]
    Client(String),
}

impl Error {
    /// HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::Forbidden(_) => 403,
            Self::NotFound(_) => 404,
            Self::MethodNotAllowed(_) => 405,
            Self::AlreadyExists(_) | Self::Conflict(_) => 409,
            Self::Gone(_) => 410,
            Self::UnsupportedMediaType(_) => 415,
            Self::Invalid(_) => 422,
            Self::Internal(_) | Self::Io { .. } | Self::Client(_) => 500,
        }
    }

    /// Kubernetes `Status.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "BadRequest",
            Self::Forbidden(_) => "Forbidden",
            Self::NotFound(_) => "NotFound",
            Self::MethodNotAllowed(_) => "MethodNotAllowed",
            Self::AlreadyExists(_) => "AlreadyExists",
            Self::Conflict(_) => "Conflict",
            Self::Gone(_) => "Expired",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::Invalid(_) => "Invalid",
            Self::Internal(_) | Self::Io { .. } | Self::Client(_) => "InternalError",
        }
    }

    /// The `Status` object sent as the response body.
    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.to_string(), "reason": self.reason(), "code": self.code()})
    }
}

/// Options for `TestApiServer`.
#[derive(Debug, Clone)]
pub struct Builder {
    history: usize,
    bookmark_interval: Duration,
    service_cidr: ServiceCidr,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            history: 100_000,
            bookmark_interval: Duration::from_secs(1),
            service_cidr: ServiceCidr {
                base: Ipv4Addr::new(10, 96, 0, 0),
                prefix: 16,
            },
        }
    }
}

impl Builder {
    /// How many events the watch history keeps (older versions answer 410 Gone). Default 100,000.
    pub fn history(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    /// How often watches that allow bookmarks get one. Default 1 s.
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// Where Service clusterIPs are allocated from. Default 10.96.0.0/16.
    pub fn service_cidr(mut self, base: Ipv4Addr, prefix: u8) -> Self {
        self.service_cidr = ServiceCidr { base, prefix };
        self
    }

    /// Binds 127.0.0.1:0 and serves on the current tokio runtime until the server is dropped.
    pub async fn start(self) -> Result<TestApiServer, Error> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|source| Error::Io {
                what: "binding 127.0.0.1:0".into(),
                source,
            })?;
        let addr: SocketAddr = listener.local_addr().map_err(|source| Error::Io {
            what: "reading the bound address".into(),
            source,
        })?;
        let store = Arc::new(Mutex::new(store::Store::new(
            self.history,
            self.service_cidr,
        )));
        let faults = FaultHandle::default();
        let state = http::AppState {
            store: store.clone(),
            faults: faults.clone(),
            bookmark_interval: self.bookmark_interval,
            pages: Arc::default(),
        };
        let (shutdown, _) = watch::channel(false);
        serve(listener, state.clone(), shutdown.subscribe());
        Ok(TestApiServer {
            url: format!("http://{addr}"),
            store,
            faults,
            state,
            shutdown,
        })
    }
}

fn serve(
    listener: tokio::net::TcpListener,
    state: http::AppState,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = http::router(state);
    tokio::spawn(async move {
        tokio::select! {
            r = axum::serve(listener, app) => if let Err(e) = r { tracing::warn!("test API server stopped: {e}") },
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    });
}

/// A running test API server. Dropping it stops accepting connections and ends open watches.
pub struct TestApiServer {
    url: String,
    store: Arc<Mutex<store::Store>>,
    faults: FaultHandle,
    state: http::AppState,
    shutdown: watch::Sender<bool>,
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.faults.drop_watches();
        self.shutdown.send_replace(true);
    }
}

fn resource(plural: &str) -> Result<&'static resources::ResourceType, Error> {
    resources::by_plural(plural)
        .ok_or_else(|| Error::NotFound(format!("resource type {plural:?} is not served")))
}

impl TestApiServer {
    /// Starts a server with default options.
    pub async fn start() -> Result<Self, Error> {
        Builder::default().start().await
    }

    /// Options before starting.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A `kube::Client` for this server (default namespace `default`). Needs a tokio runtime.
    pub fn client(&self) -> Result<kube::Client, Error> {
        let uri = self
            .url
            .parse()
            .map_err(|e| Error::Client(format!("server URL {}: {e}", self.url)))?;
        kube::Client::try_from(kube::Config::new(uri)).map_err(|e| Error::Client(e.to_string()))
    }

    /// The kubeconfig YAML pointing at this server (no credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kpr-test\n  cluster:\n    server: {}\nusers:\n- name: kpr-test\n  user: {{}}\ncontexts:\n- name: kpr-test\n  context:\n    cluster: kpr-test\n    user: kpr-test\n    namespace: default\ncurrent-context: kpr-test\n",
            self.url
        )
    }

    /// Writes `kubeconfig()` to `path`, for spawning binaries with `--kubeconfig`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig()).map_err(|source| Error::Io {
            what: format!("writing kubeconfig {}", path.display()),
            source,
        })
    }

    /// Serves the same objects on one more listener, bound by the caller: for example a socket
    /// bound inside a test network namespace, so an agent in that namespace reaches the server on
    /// its own loopback. Returns that listener's URL. Needs a tokio runtime.
    pub fn serve_also(&self, listener: std::net::TcpListener) -> Result<String, Error> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| Error::Io { what, source }
        };
        let addr = listener
            .local_addr()
            .map_err(io("reading the extra listener's address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("making the extra listener non-blocking"))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(io("registering the extra listener"))?;
        serve(listener, self.state.clone(), self.shutdown.subscribe());
        Ok(format!("http://{addr}"))
    }

    /// The kubeconfig YAML for another URL of this server (see `serve_also`).
    pub fn kubeconfig_for(&self, url: &str) -> String {
        self.kubeconfig().replace(&self.url, url)
    }

    /// The fault injection handle.
    pub fn faults(&self) -> FaultHandle {
        self.faults.clone()
    }

    fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().expect("store lock")
    }

    /// Creates an object directly (no HTTP), keeping the status it carries: for seeding tests and
    /// benchmarks. `plural` is e.g. "pods"; the namespace comes from `metadata.namespace`.
    pub fn insert(&self, plural: &str, obj: Value) -> Result<Value, Error> {
        let res = resource(plural)?;
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
        self.store().create(res, ns.as_deref(), obj, true)
    }

    /// Replaces an object directly (no HTTP, so also while faults make the API fail), as a PUT
    /// would: a new resourceVersion and a MODIFIED event for open watches.
    pub fn replace(&self, plural: &str, obj: Value) -> Result<Value, Error> {
        let res = resource(plural)?;
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.store().update(res, ns.as_deref(), &name, obj, false)
    }

    /// Deletes an object directly (no HTTP), as a DELETE without preconditions would.
    pub fn remove(
        &self,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, Error> {
        self.store()
            .delete(resource(plural)?, namespace, name, &Value::Null)
    }

    /// Reads one object directly.
    pub fn get(&self, plural: &str, namespace: Option<&str>, name: &str) -> Result<Value, Error> {
        self.store().get(resource(plural)?, namespace, name)
    }

    /// Lists all objects of a type directly.
    pub fn list(&self, plural: &str) -> Result<Vec<Value>, Error> {
        Ok(self
            .store()
            .list(resource(plural)?, &store::Filter::default())
            .0)
    }

    /// Number of objects of a type.
    pub fn count(&self, plural: &str) -> Result<usize, Error> {
        Ok(self.store().count(resource(plural)?))
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    /// Drops the whole event history: every older resourceVersion now answers 410 Gone.
    pub fn compact(&self) {
        self.store().compact();
    }
}
