//! The HTTP face of the test API server: URL parsing into (resource, namespace, name, subresource),
//! verb dispatch onto the `Store`, JSON-lines watch streams with bookmarks, `Status` error bodies,
//! and the fault switches applied to every request.
//!
//! Owns no object state; everything goes through the `Store` mutex.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::fault::FaultHandle;
use crate::patch::PatchKind;
use crate::resources::{self, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Event, Filter, Store};
use crate::Error;

/// Shared by every request.
#[derive(Clone)]
pub(crate) struct AppState {
    pub store: Arc<Mutex<Store>>,
    pub faults: FaultHandle,
    pub bookmark_interval: Duration,
    pub pages: Arc<Mutex<Pages>>,
}

/// How long a paginated listing's snapshot serves `continue` tokens.
const SNAPSHOT_TTL: Duration = Duration::from_secs(60);

/// Snapshots of paginated listings, so every page of one listing comes from the same state.
#[derive(Default)]
pub(crate) struct Pages {
    next: u64,
    snapshots: HashMap<u64, (Vec<Value>, u64, std::time::Instant)>,
}

/// The router: one fallback handler that parses Kubernetes URLs itself.
pub(crate) fn router(state: AppState) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// A parsed resource URL.
struct Target {
    res: &'static ResourceType,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Discovery(Value),
    Resource(Target),
}

fn unknown(path: &str) -> Error {
    Error::NotFound(format!(
        "the server could not find the requested resource (path {path})"
    ))
}

fn parse_path(path: &str) -> Result<Route, Error> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Discovery(resources::version())),
        ["api"] => return Ok(Route::Discovery(resources::core_versions())),
        ["apis"] => return Ok(Route::Discovery(resources::group_list())),
        ["apis", g] => {
            return resources::group(g)
                .map(Route::Discovery)
                .ok_or_else(|| unknown(path))
        }
        ["api", v] => {
            return resources::resource_list("", v)
                .map(Route::Discovery)
                .ok_or_else(|| unknown(path))
        }
        ["apis", g, v] => {
            return resources::resource_list(g, v)
                .map(Route::Discovery)
                .ok_or_else(|| unknown(path))
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(unknown(path)),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, more @ ..]
            if resources::find(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            (
                Some(ns.to_string()),
                std::iter::once(*plural)
                    .chain(more.iter().copied())
                    .collect::<Vec<_>>(),
            )
        }
        other => (None, other.to_vec()),
    };
    let res = rest
        .first()
        .and_then(|p| resources::find(group, version, p))
        .ok_or_else(|| unknown(path))?;
    if rest.len() > 3 {
        return Err(unknown(path));
    }
    Ok(Route::Resource(Target {
        res,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    }))
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).expect("JSON values serialise");
    (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

fn error_response(e: &Error) -> Response {
    let code = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.status())
}

async fn handle(
    State(st): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (stall, fail) = st.faults.on_request();
    if let Some(d) = stall {
        tokio::time::sleep(d).await;
    }
    if fail {
        return error_response(&Error::Internal(format!(
            "injected fault: {method} {uri} failed"
        )));
    }
    match dispatch(&st, &method, &uri, &headers, &body) {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

type Params = HashMap<String, String>;

fn flag(params: &Params, key: &str) -> bool {
    params.get(key).is_some_and(|v| v == "true" || v == "1")
}

fn filter_from(params: &Params, ns: Option<String>) -> Result<Filter, Error> {
    Ok(Filter {
        namespace: ns,
        labels: LabelSelector::parse(
            params
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?,
        fields: FieldSelector::parse(
            params
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?,
    })
}

fn parse_body(body: &Bytes, what: &str) -> Result<Value, Error> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body)
        .or_else(|_| serde_saphyr::from_slice(body))
        .map_err(|e| Error::BadRequest(format!("{what} body: not JSON or YAML: {e}")))
}

fn dispatch(
    st: &AppState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Error> {
    let params: Params = Query::<Params>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let t = match parse_path(uri.path())? {
        Route::Discovery(doc) if method == Method::GET => {
            return Ok(json_response(StatusCode::OK, &doc))
        }
        Route::Discovery(_) => {
            return Err(Error::MethodNotAllowed(format!("{method} {}", uri.path())))
        }
        Route::Resource(t) => t,
    };
    if st.faults.is_forbidden(t.res.plural) {
        return Err(Error::Forbidden(format!(
            "{} is forbidden: injected fault (the client may not {method} this resource)",
            t.res.plural
        )));
    }
    let ns = t.ns.as_deref();
    let mut store = st.store.lock().expect("store lock");
    let (code, out) = match (method.clone(), t.name.as_deref(), t.sub.as_deref()) {
        (Method::GET, None, None) if flag(&params, "watch") => {
            let filter = filter_from(&params, t.ns.clone())?;
            return Ok(start_watch(st, &store, t.res, filter, &params));
        }
        (Method::GET, None, None) => (
            StatusCode::OK,
            list(
                &store,
                &st.pages,
                t.res,
                filter_from(&params, t.ns.clone())?,
                &params,
            )?,
        ),
        (Method::GET, Some(name), None | Some("status")) => {
            (StatusCode::OK, store.get(t.res, ns, name)?)
        }
        (Method::POST, None, None) => (
            StatusCode::CREATED,
            store.create(t.res, ns, parse_body(body, t.res.kind)?, false)?,
        ),
        (Method::POST, Some(name), Some("binding")) if t.res.plural == "pods" => (
            StatusCode::CREATED,
            store.bind(t.res, ns, name, &parse_body(body, "Binding")?)?,
        ),
        (Method::PUT, Some(name), sub @ (None | Some("status"))) => {
            let obj = parse_body(body, t.res.kind)?;
            (
                StatusCode::OK,
                store.update(t.res, ns, name, obj, sub.is_some())?,
            )
        }
        (Method::PATCH, Some(name), sub @ (None | Some("status"))) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let kind = PatchKind::from_content_type(ct)?;
            let patch = parse_body(body, "patch")?;
            (
                StatusCode::OK,
                store.patch(t.res, ns, name, kind, &patch, sub.is_some())?,
            )
        }
        (Method::DELETE, Some(name), None) => {
            let opts = parse_body(body, "DeleteOptions")?;
            (
                StatusCode::OK,
                store.delete(t.res, ns, name, &opts["preconditions"])?,
            )
        }
        (Method::DELETE, None, None) => {
            let items = store.delete_collection(t.res, &filter_from(&params, t.ns.clone())?);
            (
                StatusCode::OK,
                list_doc(t.res, items, store.resource_version()),
            )
        }
        _ => {
            return Err(Error::MethodNotAllowed(format!(
                "{method} {}: not supported",
                uri.path()
            )))
        }
    };
    Ok(json_response(code, &out))
}

fn list_doc(res: &ResourceType, items: Vec<Value>, rv: u64) -> Value {
    json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
           "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

/// Lists matching objects. With `limit`, the listing is cut into pages served from one snapshot
/// (the `continue` token names the snapshot and the offset; an expired token answers 410 Gone).
/// `resourceVersionMatch=Exact` can only be served at the current version.
fn list(
    store: &Store,
    pages: &Mutex<Pages>,
    res: &ResourceType,
    filter: Filter,
    params: &Params,
) -> Result<Value, Error> {
    if params.get("resourceVersionMatch").map(String::as_str) == Some("Exact") {
        let want = params.get("resourceVersion").cloned().unwrap_or_default();
        if want != store.resource_version().to_string() {
            return Err(Error::Gone(format!(
                "too old resource version: {want} ({})",
                store.resource_version()
            )));
        }
    }
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let token = params.get("continue").filter(|c| !c.is_empty());
    let Some(limit) = limit.or(token.map(|_| usize::MAX)) else {
        let (items, rv) = store.list(res, &filter);
        return Ok(list_doc(res, items, rv));
    };
    let mut pages = pages.lock().expect("pages lock");
    pages
        .snapshots
        .retain(|_, (_, _, at)| at.elapsed() < SNAPSHOT_TTL);
    let (id, offset) = match token {
        Some(t) => parse_token(t)?,
        None => {
            let (items, rv) = store.list(res, &filter);
            pages.next += 1;
            let id = pages.next;
            pages
                .snapshots
                .insert(id, (items, rv, std::time::Instant::now()));
            (id, 0)
        }
    };
    let gone = || {
        Error::Gone(
            "the provided continue parameter is too old to display a consistent list result".into(),
        )
    };
    let (items, rv, _) = pages.snapshots.get(&id).ok_or_else(gone)?;
    let end = offset.saturating_add(limit).min(items.len());
    let page = items.get(offset..end).ok_or_else(gone)?.to_vec();
    let mut doc = list_doc(res, page, *rv);
    if end < items.len() {
        doc["metadata"]["continue"] = json!(format!("{id}:{end}"));
        doc["metadata"]["remainingItemCount"] = json!(items.len() - end);
    } else {
        pages.snapshots.remove(&id);
    }
    Ok(doc)
}

fn parse_token(t: &str) -> Result<(u64, usize), Error> {
    let bad = || Error::BadRequest(format!("continue {t:?}: not a token this server issued"));
    let (id, offset) = t.split_once(':').ok_or_else(bad)?;
    Ok((
        id.parse().map_err(|_| bad())?,
        offset.parse().map_err(|_| bad())?,
    ))
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object}))
        .expect("JSON values serialise");
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(res: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}),
    )
}

fn gone_line(msg: &str) -> Bytes {
    line(
        "ERROR",
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": msg, "reason": "Expired", "code": 410}),
    )
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("static response parts are valid")
}

/// What a watch sends before following live events.
struct WatchStart {
    initial: Vec<Value>,
    initial_end_bookmark: Option<u64>,
    backlog: Vec<Arc<Event>>,
    from: u64,
}

/// Starts a watch. A version older than the retained history answers, like the real server, with a
/// 200 stream holding one ERROR event with code 410.
fn start_watch(
    st: &AppState,
    store: &Store,
    res: &'static ResourceType,
    filter: Filter,
    params: &Params,
) -> Response {
    let rv = params
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let send_initial = flag(params, "sendInitialEvents");
    let (tx, rx) = mpsc::channel(1024);
    let (start, live) = if rv.is_empty() || rv == "0" || send_initial {
        let (items, now) = store.list(res, &filter);
        let (backlog, live) = store
            .watch_from(now)
            .expect("the current version is never compacted");
        let end = send_initial.then_some(now);
        (
            WatchStart {
                initial: items,
                initial_end_bookmark: end,
                backlog,
                from: now,
            },
            live,
        )
    } else {
        let parsed = rv
            .parse::<u64>()
            .map_err(|_| Error::BadRequest(format!("resourceVersion {rv:?}: not a number")));
        match parsed.and_then(|from| store.watch_from(from).map(|w| (from, w))) {
            Ok((from, (backlog, live))) => (
                WatchStart {
                    initial: Vec::new(),
                    initial_end_bookmark: None,
                    backlog,
                    from,
                },
                live,
            ),
            Err(Error::Gone(msg)) => {
                let _ = tx.try_send(gone_line(&msg));
                return stream_response(rx);
            }
            Err(e) => return error_response(&e),
        }
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let opts = WatchOpts {
        res,
        filter,
        bookmarks: flag(params, "allowWatchBookmarks"),
        bookmark_interval: st.bookmark_interval,
        timeout: timeout.unwrap_or(Duration::from_secs(1800)),
    };
    tokio::spawn(run_watch(tx, start, live, opts, st.faults.watch_drops()));
    stream_response(rx)
}

struct WatchOpts {
    res: &'static ResourceType,
    filter: Filter,
    bookmarks: bool,
    bookmark_interval: Duration,
    timeout: Duration,
}

async fn run_watch(
    tx: mpsc::Sender<Bytes>,
    start: WatchStart,
    mut live: broadcast::Receiver<Arc<Event>>,
    o: WatchOpts,
    mut drops: tokio::sync::watch::Receiver<u64>,
) {
    drops.mark_unchanged();
    for obj in &start.initial {
        if tx.send(line("ADDED", obj)).await.is_err() {
            return;
        }
    }
    if let Some(rv) = start.initial_end_bookmark {
        if tx.send(bookmark(o.res, rv, true)).await.is_err() {
            return;
        }
    }
    let mut last_rv = start.from;
    for ev in &start.backlog {
        last_rv = last_rv.max(ev.rv);
        if let Some((kind, obj)) = ev.view(o.res, &o.filter) {
            if tx.send(line(kind, obj)).await.is_err() {
                return;
            }
        }
    }
    let deadline = tokio::time::sleep(o.timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(o.bookmark_interval);
    tick.tick().await;
    loop {
        let out = tokio::select! {
            ev = live.recv() => match ev {
                Ok(ev) if ev.rv <= last_rv => continue,
                Ok(ev) => {
                    last_rv = ev.rv;
                    match ev.view(o.res, &o.filter) {
                        Some((kind, obj)) => line(kind, obj),
                        None => continue,
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let _ = tx.send(gone_line(&format!("too old resource version: watcher fell {n} events behind"))).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick(), if o.bookmarks => bookmark(o.res, last_rv, false),
            _ = &mut deadline => return,
            _ = drops.changed() => return,
            _ = tx.closed() => return,
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_into_targets() {
        let cases = [
            ("/api/v1/namespaces/ns/pods", "pods", Some("ns"), None, None),
            ("/api/v1/pods", "pods", None, None, None),
            (
                "/api/v1/namespaces/ns/pods/p/status",
                "pods",
                Some("ns"),
                Some("p"),
                Some("status"),
            ),
            (
                "/api/v1/namespaces/ns",
                "namespaces",
                None,
                Some("ns"),
                None,
            ),
            (
                "/api/v1/namespaces/ns/status",
                "namespaces",
                None,
                Some("ns"),
                Some("status"),
            ),
            ("/api/v1/nodes/n1", "nodes", None, Some("n1"), None),
            (
                "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices/s",
                "endpointslices",
                Some("a"),
                Some("s"),
                None,
            ),
        ];
        for (path, plural, ns, name, sub) in cases {
            let Ok(Route::Resource(t)) = parse_path(path) else {
                panic!("{path}: not a resource route")
            };
            assert_eq!(
                (
                    t.res.plural,
                    t.ns.as_deref(),
                    t.name.as_deref(),
                    t.sub.as_deref()
                ),
                (plural, ns, name, sub),
                "{path}"
            );
        }
        assert!(parse_path("/api/v1/widgets").is_err());
        assert!(matches!(parse_path("/apis"), Ok(Route::Discovery(_))));
    }
}
