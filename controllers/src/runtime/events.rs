//! core/v1 Events as kube-controller-manager's controllers record them (client-go's
//! `tools/record` recorder and its `EventCorrelator`): an Event names the object it is about
//! (apiVersion, kind, namespace, name, uid, resourceVersion), its source component, reason,
//! message and type, with `firstTimestamp`/`lastTimestamp`/`count`.
//!
//! Before an Event is written it is correlated, as client-go does:
//! - an identical event (same source, object, type, reason and message) is counted on the Event
//!   already written: a patch of `count`, `lastTimestamp` and `message`, not a new Event;
//! - from the 10th distinct message of one (source, object, type, reason) within 10 minutes on,
//!   the messages are combined into one Event, "(combined from similar events): <message>";
//! - a source may record a burst of 25 events about one object, then one every 5 minutes; the
//!   rest are dropped.
//!
//! Owns: writing Events. Best effort, off the caller's path: `publish` only queues (1000 pending
//! at most, as client-go's broadcaster; more are dropped), one writer task per recorder hands
//! them to per-object writers (each object's events in order; one object at a time for the
//! controllers, as `tools/record`, up to 64 objects at once for the scheduler, as
//! `tools/events`), and failures are logged at debug, never returned. Differs from client-go: a
//! write that fails for a transport error is not retried (client-go retries 12 times, 10 s apart).
//! Knows no particular controller.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};

/// client-go's LRU size for each of the correlator's caches.
const CACHE_ENTRIES: usize = 4096;

/// Distinct messages of one reason within [`AGGREGATE_WINDOW`] from which they are combined.
const AGGREGATE_MAX_EVENTS: usize = 10;

/// A group of similar events older than this starts afresh.
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);

/// The prefix of a combined Event's message.
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// Events a source may record about one object at once ...
const SPAM_BURST: f64 = 25.0;

/// ... and the refill rate afterwards (one per 5 minutes).
const SPAM_PER_SECOND: f64 = 1.0 / 300.0;

/// Events waiting for the writer; more are dropped (client-go's `maxQueuedEvents`).
const MAX_QUEUED: usize = 1000;

/// How long a [`Recorder::concurrent`] remembers an event it has not seen again: client-go's
/// `tools/events` (kube-scheduler's recorder) drops an event from its cache once it is this old,
/// checking every this often (its `finishTime`), so an entry lives between one and two of these.
pub const SERIES_FINISH: Duration = Duration::from_secs(6 * 60);

/// The `Event.type` of a normal event.
pub const NORMAL: &str = "Normal";

/// The `Event.type` of a warning.
pub const WARNING: &str = "Warning";

/// Records Events from one source component. Cheap to clone; clones share the correlation state
/// and the writer.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    component: &'static str,
    writers: usize,
    forget_after: Option<Duration>,
    sender: Arc<OnceLock<mpsc::Sender<Event>>>,
}

impl Recorder {
    /// A recorder writing Events with `source.component` = `component` through `client`, one at
    /// a time, as client-go's `tools/record` that kube-controller-manager's controllers use: its
    /// rate is bounded by the API server's latency, and what a burst queues beyond
    /// [`MAX_QUEUED`] is dropped. A mass rollout's Events then cost the API server about what
    /// they cost it under kube-controller-manager.
    pub fn new(client: Client, component: &'static str) -> Self {
        Self {
            client,
            component,
            writers: 1,
            forget_after: None,
            sender: Arc::default(),
        }
    }

    /// A recorder writing the Events of up to [`WRITERS`] objects at once, as kube-scheduler's
    /// `tools/events` writes each event in a goroutine of its own, and forgetting an event not
    /// seen for [`SERIES_FINISH`], as that cache does. The scheduler's events are about Pods, a
    /// new object each time: with only `tools/record`'s bound (4,096 entries per cache) its
    /// memory rose for the better part of an hour under a steady Pod churn before the caches
    /// were full (docs/RELIABILITY.md, scenario 7); with the time bound they hold what the last
    /// minutes recorded.
    pub fn concurrent(client: Client, component: &'static str) -> Self {
        Self {
            writers: WRITERS,
            forget_after: Some(SERIES_FINISH),
            ..Self::new(client, component)
        }
    }

    /// Records an event about `regarding` (type Warning if `warning`, else Normal) in the
    /// background. Must be called within a tokio runtime (the first call starts the writer).
    pub fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        message: String,
    ) {
        let event = make_event(
            self.component,
            regarding,
            if warning { WARNING } else { NORMAL },
            reason,
            message,
            Timestamp::now(),
        );
        let sender = self.sender.get_or_init(|| {
            let (tx, rx) = mpsc::channel(MAX_QUEUED);
            let client = self.client.clone();
            let writers = self.writers;
            let correlator = match self.forget_after {
                Some(age) => Correlator::forgetting_after(age),
                None => Correlator::default(),
            };
            tokio::spawn(write_all(rx, writers, correlator, move |w| {
                write_one(client.clone(), w)
            }));
            tx
        });
        if let Err(e) = sender.try_send(event) {
            tracing::debug!(component = self.component, reason, "event dropped: {e}");
        }
    }
}

/// The Event client-go's recorder makes before correlation: named `<object name>.<nanoseconds in
/// hex>`, in the object's namespace (`default` for a cluster-scoped object), counted once.
pub fn make_event(
    component: &str,
    regarding: &ObjectReference,
    type_: &str,
    reason: &str,
    message: String,
    at: Timestamp,
) -> Event {
    let namespace = regarding
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let now = Time(at);
    Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or_default(),
                at.as_nanosecond()
            )),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: regarding.clone(),
        reason: Some(reason.to_string()),
        message: Some(message),
        type_: Some(type_.to_string()),
        source: Some(EventSource {
            component: Some(component.to_string()),
            host: None,
        }),
        reporting_component: Some(component.to_string()),
        reporting_instance: Some(String::new()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    }
}

/// Writes in flight at once, each about a different object, of a [`Recorder::concurrent`].
///
/// One write at a time caps a recorder at 1 / (API server latency) Events a second: under the load
/// of a scheduler binding a burst of Pods (its own bindings queue in the same API Priority and
/// Fairness flow) that was 4-5 a second while 150 Pods a second were bound, so nearly every
/// "Scheduled" Event was still queued when the scheduler stopped. kube-scheduler's recorder
/// (client-go `tools/events`) writes every event in a goroutine of its own; client-go's
/// `tools/record` (kube-controller-manager's) writes one at a time. This keeps each object's
/// events in order, correlated and written one after the other as `tools/record` does (every
/// correlation key starts with the source and the object, so per object the counts, aggregation
/// and spam filter behave exactly as there), and writes up to this many objects' events at once.
pub const WRITERS: usize = 64;

/// The writer: hands each queued event to the writer of its object (started when the object has
/// none, at most `writers` at once), which correlates it with `correlator`, then creates or
/// patches it through `sink`, then the next event of the same object, until none is left.
pub(crate) async fn write_all<S, F>(
    mut rx: mpsc::Receiver<Event>,
    writers: usize,
    correlator: Correlator,
    sink: S,
) where
    S: Fn(Write) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Event, kube::Error>> + Send + 'static,
{
    let correlator = Arc::new(Mutex::new(correlator));
    // The objects with a writer, and their events waiting for it.
    let pending: Arc<Mutex<HashMap<String, VecDeque<Event>>>> = Arc::default();
    let writers = Arc::new(Semaphore::new(writers.max(1)));
    while let Some(event) = rx.recv().await {
        let key = join(object_key(&event));
        {
            let mut pending = pending.lock().expect("event queue lock");
            if let Some(queue) = pending.get_mut(&key) {
                if queue.len() < MAX_QUEUED {
                    queue.push_back(event);
                } else {
                    tracing::debug!(reason = field(&event.reason), "event dropped: queue full");
                }
                continue;
            }
        }
        let Ok(permit) = writers.clone().acquire_owned().await else {
            return;
        };
        // Registered only now: the writer that held this object may have finished meanwhile.
        pending
            .lock()
            .expect("event queue lock")
            .insert(key.clone(), VecDeque::new());
        let (correlator, pending, sink) = (correlator.clone(), pending.clone(), sink.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let mut next = Some(event);
            while let Some(event) = next {
                write_correlated(&correlator, &sink, event).await;
                let mut pending = pending.lock().expect("event queue lock");
                next = pending.get_mut(&key).and_then(VecDeque::pop_front);
                if next.is_none() {
                    pending.remove(&key);
                }
            }
        });
    }
}

async fn write_correlated<S, F>(correlator: &Mutex<Correlator>, sink: &S, event: Event)
where
    S: Fn(Write) -> F,
    F: Future<Output = Result<Event, kube::Error>>,
{
    let write = correlator
        .lock()
        .expect("event correlator lock")
        .correlate(event, Instant::now());
    let reason = match &write {
        Write::Skip => return,
        Write::Create(e) | Write::Patch(e) => e.reason.clone().unwrap_or_default(),
    };
    match sink(write).await {
        Ok(written) => correlator
            .lock()
            .expect("event correlator lock")
            .update_state(&written, Instant::now()),
        Err(e) => tracing::debug!(reason, "recording event: {e}"),
    }
}

async fn write_one(client: Client, write: Write) -> Result<Event, kube::Error> {
    let (mut event, patch) = match write {
        Write::Skip => unreachable!("skipped events are not written"),
        Write::Create(e) => (e, false),
        Write::Patch(e) => (e, true),
    };
    let ns = event.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client, &ns);
    if patch {
        let name = event.metadata.name.clone().unwrap_or_default();
        let body = json!({
            "count": event.count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            // The Event expired (the API server's event TTL): written again, as client-go does.
            Err(e) if crate::runtime::apierrors::is_not_found(&e) => {}
            other => return other,
        }
    }
    event.metadata.resource_version = None;
    api.create(&PostParams::default(), &event).await
}

/// What to do with one event after correlation.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Create this Event.
    Create(Event),
    /// Patch the Event of this name with this one's `count`, `lastTimestamp` and `message`.
    Patch(Event),
    /// Dropped by the spam filter.
    Skip,
}

/// client-go's `EventCorrelator` with its default options: aggregation, counting and the spam
/// filter, each over an LRU cache of [`CACHE_ENTRIES`]; optionally also forgetting what it has
/// not seen for a while ([`Correlator::forgetting_after`]). Pure: the caller supplies the time.
#[derive(Default)]
pub struct Correlator {
    aggregates: Lru<Aggregate>,
    logs: Lru<Log>,
    spam: Lru<Bucket>,
    /// Entries unused for longer are dropped, at most once per this long.
    forget_after: Option<Duration>,
    /// When the next sweep of old entries is due (set by the first event).
    next_sweep: Option<Instant>,
}

struct Aggregate {
    messages: HashSet<String>,
    last: Instant,
}

#[derive(Clone)]
struct Log {
    count: i32,
    first: Option<Time>,
    name: String,
    resource_version: Option<String>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

fn field(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

/// The source and object of an event (client-go's spam key).
fn object_key(e: &Event) -> Vec<&str> {
    let o = &e.involved_object;
    vec![
        e.source
            .as_ref()
            .and_then(|s| s.component.as_deref())
            .unwrap_or_default(),
        e.source
            .as_ref()
            .and_then(|s| s.host.as_deref())
            .unwrap_or_default(),
        field(&o.kind),
        field(&o.namespace),
        field(&o.name),
        field(&o.uid),
        field(&o.api_version),
    ]
}

fn join(parts: Vec<&str>) -> String {
    parts.join("\u{0}")
}

/// Everything that makes two events the same (client-go's `getEventKey`).
fn event_key(e: &Event) -> String {
    let mut k = object_key(e);
    k.push(field(&e.involved_object.field_path));
    k.push(field(&e.type_));
    k.push(field(&e.reason));
    k.push(field(&e.message));
    join(k)
}

/// Everything but the message (client-go's `EventAggregatorByReasonFunc`).
fn aggregate_key(e: &Event) -> String {
    let mut k = object_key(e);
    k.push(field(&e.type_));
    k.push(field(&e.reason));
    k.push(field(&e.reporting_component));
    k.push(field(&e.reporting_instance));
    join(k)
}

impl Correlator {
    /// A correlator that also forgets, every `age`, the entries it has not used for `age`: an
    /// event then lives in it between one and two of `age` after its last use (client-go's
    /// `tools/events` with `age` = [`SERIES_FINISH`]).
    pub fn forgetting_after(age: Duration) -> Self {
        Self {
            forget_after: Some(age),
            ..Self::default()
        }
    }

    /// The entries held, over the three caches.
    pub fn len(&self) -> usize {
        self.aggregates.entries.len() + self.logs.entries.len() + self.spam.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops what has not been used for `forget_after`, when a sweep is due at `now`.
    fn sweep(&mut self, now: Instant) {
        let Some(age) = self.forget_after else {
            return;
        };
        match self.next_sweep {
            Some(due) if now < due => return,
            Some(_) => {
                self.aggregates.forget_older(now, age);
                self.logs.forget_older(now, age);
                self.spam.forget_older(now, age);
            }
            None => {}
        }
        self.next_sweep = Some(now + age);
    }

    /// Correlates `event` (as made by [`make_event`]) observed at `now`.
    pub fn correlate(&mut self, event: Event, now: Instant) -> Write {
        self.sweep(now);
        let (mut event, key) = self.aggregate(event, now);
        let previous = self.logs.get(&key, now).cloned();
        if let Some(log) = previous {
            event.metadata.name = Some(log.name);
            event.metadata.resource_version = log.resource_version;
            event.first_timestamp = log.first;
            event.count = Some(log.count + 1);
        }
        self.logs.put(
            key,
            now,
            Log {
                count: event.count.unwrap_or(1),
                first: event.first_timestamp.clone(),
                name: event.metadata.name.clone().unwrap_or_default(),
                resource_version: event.metadata.resource_version.clone(),
            },
        );
        // The spam filter runs last, so a dropped repeat still counts (as in client-go).
        if !self.accept(&event, now) {
            return Write::Skip;
        }
        if event.count.unwrap_or(1) > 1 {
            Write::Patch(event)
        } else {
            Write::Create(event)
        }
    }

    /// Records the Event as the API server returned it (its name, resourceVersion and count).
    pub fn update_state(&mut self, written: &Event, now: Instant) {
        self.logs.put(
            event_key(written),
            now,
            Log {
                count: written.count.unwrap_or(1),
                first: written.first_timestamp.clone(),
                name: written.metadata.name.clone().unwrap_or_default(),
                resource_version: written.metadata.resource_version.clone(),
            },
        );
    }

    /// The event to count and its key: itself, or from the 10th distinct message of its kind
    /// within the window, the combined Event under the key of its kind.
    fn aggregate(&mut self, event: Event, now: Instant) -> (Event, String) {
        let key = aggregate_key(&event);
        let fresh = || Aggregate {
            messages: HashSet::new(),
            last: now,
        };
        let record = self.aggregates.get_or_insert_with(key.clone(), now, fresh);
        if now.saturating_duration_since(record.last) > AGGREGATE_WINDOW {
            *record = fresh();
        }
        record.messages.insert(field(&event.message).to_string());
        record.last = now;
        if record.messages.len() < AGGREGATE_MAX_EVENTS {
            let key = event_key(&event);
            return (event, key);
        }
        // Keep the set at its maximum, as client-go (which removes an arbitrary member).
        if let Some(any) = record.messages.iter().next().cloned() {
            record.messages.remove(&any);
        }
        let message = format!("{COMBINED_PREFIX}{}", field(&event.message));
        let combined = Event {
            metadata: ObjectMeta {
                name: event.metadata.name,
                namespace: event.metadata.namespace,
                ..Default::default()
            },
            involved_object: event.involved_object,
            reason: event.reason,
            message: Some(message),
            type_: event.type_,
            source: event.source,
            reporting_component: event.reporting_component,
            reporting_instance: event.reporting_instance,
            first_timestamp: event.last_timestamp.clone(),
            last_timestamp: event.last_timestamp,
            count: Some(1),
            ..Default::default()
        };
        (combined, key)
    }

    /// The per source and object token bucket.
    fn accept(&mut self, event: &Event, now: Instant) -> bool {
        let bucket = self
            .spam
            .get_or_insert_with(join(object_key(event)), now, || Bucket {
                tokens: SPAM_BURST,
                at: now,
            });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * SPAM_PER_SECOND).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A map that forgets its least recently used entry beyond [`CACHE_ENTRIES`], and on request
/// the entries unused since some time.
struct Lru<V> {
    /// Each value with its last use: a tick (for the least recently used) and the time.
    entries: HashMap<String, (u64, Instant, V)>,
    tick: u64,
}

impl<V> Default for Lru<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            tick: 0,
        }
    }
}

impl<V> Lru<V> {
    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn get(&mut self, key: &str, now: Instant) -> Option<&V> {
        let t = self.touch();
        self.entries.get_mut(key).map(|(used, at, v)| {
            (*used, *at) = (t, now);
            &*v
        })
    }

    fn get_or_insert_with(&mut self, key: String, now: Instant, f: impl FnOnce() -> V) -> &mut V {
        if !self.entries.contains_key(&key) {
            self.evict();
        }
        let t = self.touch();
        let (used, at, v) = self.entries.entry(key).or_insert_with(|| (t, now, f()));
        (*used, *at) = (t, now);
        v
    }

    fn put(&mut self, key: String, now: Instant, v: V) {
        if !self.entries.contains_key(&key) {
            self.evict();
        }
        let t = self.touch();
        self.entries.insert(key, (t, now, v));
    }

    fn evict(&mut self) {
        if self.entries.len() < CACHE_ENTRIES {
            return;
        }
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(_, (used, _, _))| *used)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            self.entries.remove(&k);
        }
    }

    /// Drops the entries last used more than `age` before `now`, and the table's room when it
    /// is mostly empty (a burst's table is not kept for the quiet that follows).
    fn forget_older(&mut self, now: Instant, age: Duration) {
        self.entries
            .retain(|_, (_, at, _)| now.saturating_duration_since(*at) <= age);
        if self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to_fit();
        }
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
