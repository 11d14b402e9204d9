//! Least-connection for the rule backends, driven by conntrack events.
//!
//! Owns [`LcTable`] (per-endpoint active connection counts and, per target, the endpoints it
//! currently spreads new connections over) and [`LeastConn`] (the event-driven controller). The
//! rule backends mark every connection with its target id (ct mark) and spread a least-connection
//! target's new connections round-robin over its *picks*: the endpoints tied for the fewest
//! connections. Each conntrack NEW event counts a connection on the endpoint of its reply tuple; a
//! TCP state past ESTABLISHED or a DESTROY uncounts it. After every batch of events the
//! controller moves each affected target's picks through the backend's [`Steer`].
//!
//! How exact: the picks are one dataplane update behind the events. Connections opened faster
//! than one event round trip plus one `nft`/`iptables-restore` run see the picks of before them,
//! and a pick narrowed to the one least-loaded endpoint would take the whole burst. So a target
//! whose new connections come less than [`BURST_WINDOW`] apart is in a *burst*: its picks are
//! all its endpoints (plain round-robin) until it has had no new connection for that long, when
//! they narrow to the ties again (the worker wakes for it). Least-connection is thus never less
//! even than round-robin, and exact for connections that come further apart than the window.
//! Connections that existed before the controller started are not counted. A TCP connection
//! stops counting at its first FIN or RST, a UDP flow when its conntrack entry is destroyed
//! (after the UDP timeout). Counts are per endpoint across all Services on this node.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::DataplaneError;
use crate::state::LiveView;

use super::events::{CtEvent, CtEventKind, CtUpdate, EventStream};

/// New connections of one target closer together than this are a burst (module docs). Well above
/// one event round trip plus one dataplane update on a busy node, well below the pace at which
/// exact picks are expected (a client opening a connection every few hundred milliseconds).
pub const BURST_WINDOW: Duration = Duration::from_millis(200);

/// A target's picks moved from `old` to `new` (empty: not programmed / to be removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickChange {
    pub id: u32,
    /// Backend-defined name of the target (e.g. the iptables chain).
    pub label: String,
    pub old: Vec<SocketAddr>,
    pub new: Vec<SocketAddr>,
    /// All the target's endpoints, in its order (empty when the target is removed): a dataplane
    /// that walks fixed slots gives each endpoint its own slots, so that its round-robin runs
    /// on unchanged while the tie set changes.
    pub endpoints: Vec<SocketAddr>,
}

#[derive(Debug, Clone)]
struct LcTarget {
    label: String,
    endpoints: Vec<SocketAddr>,
    /// Where the round-robin among equally loaded endpoints continues.
    cursor: usize,
    /// What the dataplane currently spreads new connections over: the endpoints tied for the
    /// least connections (all endpoints in a burst), in round-robin order from the cursor.
    programmed: Vec<SocketAddr>,
    /// When the agent saw this target's last new connection.
    last_new: Option<Instant>,
    /// Whether that connection came within [`BURST_WINDOW`] of the one before.
    burst: bool,
}

impl LcTarget {
    /// Whether `now` is within [`BURST_WINDOW`] of the last new connection.
    fn within_window(&self, now: Instant) -> bool {
        self.last_new
            .is_some_and(|l| now.saturating_duration_since(l) < BURST_WINDOW)
    }

    /// In a burst at `now`: until one window after its last new connection.
    fn bursting(&self, now: Instant) -> bool {
        self.burst && self.within_window(now)
    }

    /// Its endpoints in round-robin order from the cursor.
    fn in_turn(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        crate::balance::from_cursor(self.endpoints.len(), self.cursor).map(|i| self.endpoints[i])
    }
}

/// A least-connection target a backend has programmed: (id, label, endpoints). The label is
/// the backend's name for it (e.g. its iptables chain), for logs and steering.
pub type LcWanted = (u32, String, Vec<SocketAddr>);

/// Counts and picks; everything here is pure bookkeeping.
#[derive(Debug, Default)]
pub struct LcTable {
    targets: HashMap<u32, LcTarget>,
    counts: HashMap<SocketAddr, u64>,
    /// Counted connections: conntrack id -> endpoint.
    open: HashMap<u32, SocketAddr>,
}

impl LcTable {
    /// Makes the targets exactly `wanted`: registers or updates those, removes the others. After
    /// a rebuild of the dataplane (`rebuilt`) no pick is programmed any more. Returns the pick
    /// changes to program, in the same transaction as the targets themselves.
    pub fn reconcile(&mut self, wanted: &[LcWanted], rebuilt: bool) -> Vec<PickChange> {
        if rebuilt {
            self.forget_programmed();
        }
        let keep: std::collections::HashSet<u32> = wanted.iter().map(|w| w.0).collect();
        let gone: Vec<u32> = self
            .targets
            .keys()
            .copied()
            .filter(|id| !keep.contains(id))
            .collect();
        let mut changes: Vec<PickChange> = gone
            .into_iter()
            .filter_map(|id| self.remove_target(id))
            .collect();
        for (id, label, eps) in wanted {
            changes.extend(self.set_target(*id, label, eps));
        }
        changes
    }

    /// Registers or updates a target; returns the pick change to program, if any.
    pub fn set_target(
        &mut self,
        id: u32,
        label: &str,
        endpoints: &[SocketAddr],
    ) -> Option<PickChange> {
        let t = self.targets.entry(id).or_insert_with(|| LcTarget {
            label: label.to_string(),
            endpoints: Vec::new(),
            cursor: 0,
            programmed: Vec::new(),
            last_new: None,
            burst: false,
        });
        t.label = label.to_string();
        if t.endpoints != endpoints {
            t.endpoints = endpoints.to_vec();
            t.cursor = 0;
        }
        self.repick(id, Instant::now())
    }

    /// Forgets a target; returns the change that removes its pick, if one was programmed.
    pub fn remove_target(&mut self, id: u32) -> Option<PickChange> {
        let t = self.targets.remove(&id)?;
        (!t.programmed.is_empty()).then(|| PickChange {
            id,
            label: t.label,
            old: t.programmed,
            new: Vec::new(),
            endpoints: Vec::new(),
        })
    }

    /// The dataplane was rebuilt without picks: every target needs its pick programmed again.
    pub fn forget_programmed(&mut self) {
        for t in self.targets.values_mut() {
            t.programmed.clear();
        }
    }

    /// The endpoints target `id` currently spreads new connections over.
    pub fn picks(&self, id: u32) -> &[SocketAddr] {
        self.targets.get(&id).map_or(&[], |t| &t.programmed)
    }

    /// The targets currently known, by id.
    pub fn target_ids(&self) -> Vec<u32> {
        self.targets.keys().copied().collect()
    }

    /// Accounts one event, seen at `now`; returns the targets whose pick must move.
    pub fn on_event(&mut self, ev: &CtEvent, now: Instant) -> Vec<PickChange> {
        let Some(ep) = ev.endpoint else {
            return Vec::new();
        };
        let affected: Vec<u32> = if ev.kind == CtEventKind::New || !ev.closes() {
            if ev.kind != CtEventKind::New || !self.targets.contains_key(&ev.mark) {
                return Vec::new();
            }
            if self.open.insert(ev.id, ep).is_none() {
                *self.counts.entry(ep).or_default() += 1;
            }
            if let Some(t) = self.targets.get_mut(&ev.mark) {
                if let Some(i) = t.endpoints.iter().position(|e| *e == ep) {
                    t.cursor = (i + 1) % t.endpoints.len();
                }
                t.burst = t.within_window(now);
                t.last_new = Some(now);
            }
            self.targets_with(ep)
        } else {
            let Some(ep) = self.open.remove(&ev.id) else {
                return Vec::new();
            };
            if let Some(c) = self.counts.get_mut(&ep) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    self.counts.remove(&ep);
                }
            }
            self.targets_with(ep)
        };
        affected
            .into_iter()
            .filter_map(|id| self.repick(id, now))
            .collect()
    }

    /// When the earliest burst ends (the worker wakes then to narrow its picks), if any.
    pub fn next_burst_end(&self) -> Option<Instant> {
        self.targets
            .values()
            .filter(|t| t.burst)
            .filter_map(|t| t.last_new)
            .map(|l| l + BURST_WINDOW)
            .min()
    }

    /// Ends the bursts that are over at `now`; returns the picks that narrow.
    pub fn end_bursts(&mut self, now: Instant) -> Vec<PickChange> {
        let over: Vec<u32> = self
            .targets
            .iter_mut()
            .filter(|(_, t)| t.burst && !t.bursting(now))
            .map(|(id, t)| {
                t.burst = false;
                *id
            })
            .collect();
        over.into_iter()
            .filter_map(|id| self.repick(id, now))
            .collect()
    }

    /// Events were lost: recounts from `entries`, every live entry of the table, and returns the
    /// targets whose picks must move. Round-robin cursors are kept.
    pub fn recount(&mut self, entries: &[CtEvent]) -> Vec<PickChange> {
        self.open.clear();
        self.counts.clear();
        for e in entries {
            let Some(ep) = e.endpoint else { continue };
            if e.closes() || !self.targets.contains_key(&e.mark) {
                continue;
            }
            if self.open.insert(e.id, ep).is_none() {
                *self.counts.entry(ep).or_default() += 1;
            }
        }
        let ids: Vec<u32> = self.targets.keys().copied().collect();
        let now = Instant::now();
        ids.into_iter()
            .filter_map(|id| self.repick(id, now))
            .collect()
    }

    /// Active connections per endpoint.
    pub fn counts(&self) -> BTreeMap<SocketAddr, u64> {
        self.counts.iter().map(|(e, c)| (*e, *c)).collect()
    }

    fn targets_with(&self, ep: SocketAddr) -> Vec<u32> {
        self.targets
            .iter()
            .filter(|(_, t)| t.endpoints.contains(&ep))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The endpoints tied for the least connections, in round-robin order from the cursor.
    fn ties(&self, t: &LcTarget) -> Vec<SocketAddr> {
        crate::balance::least_loaded_ties(t.in_turn(), |e| self.counts.get(e).copied().unwrap_or(0))
    }

    /// The picks of target `id` at `now`: every endpoint in a burst, else the ties.
    fn repick(&mut self, id: u32, now: Instant) -> Option<PickChange> {
        let target = self.targets.get(&id)?;
        let bursting = target.bursting(now);
        // Already spreading over every endpoint: the dataplane's round-robin runs on as it is.
        if bursting && target.programmed.len() == target.endpoints.len() {
            return None;
        }
        let ties = if bursting {
            target.in_turn().collect()
        } else {
            self.ties(target)
        };
        let t = self.targets.get_mut(&id)?;
        if ties == t.programmed {
            return None;
        }
        let change = PickChange {
            id,
            label: t.label.clone(),
            old: std::mem::replace(&mut t.programmed, ties.clone()),
            new: ties,
            endpoints: t.endpoints.clone(),
        };
        Some(change)
    }
}

/// How a backend moves picks in its dataplane.
pub trait Steer: Send + 'static {
    fn steer(&mut self, changes: &[PickChange]) -> Result<(), DataplaneError>;
}

/// The running controller: the event stream, a worker that applies picks, and the shared table.
pub struct LeastConn {
    table: Arc<Mutex<LcTable>>,
    _events: EventStream,
}

impl LeastConn {
    /// Subscribes to conntrack events and starts the worker, both in the calling thread's network
    /// namespace.
    pub fn start(steer: Box<dyn Steer>) -> Result<LeastConn, DataplaneError> {
        let table = Arc::new(Mutex::new(LcTable::default()));
        let (tx, rx) = mpsc::channel::<CtUpdate>();
        let netns = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(|e| DataplaneError::io("opening /proc/thread-self/ns/net", e))?;
        let worker_table = Arc::clone(&table);
        std::thread::Builder::new()
            .name("kpr-leastconn".into())
            .spawn(move || {
                if let Err(e) = nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET) {
                    tracing::error!(
                        "least-connection worker cannot enter its network namespace: {e}"
                    );
                    return;
                }
                run_worker(&worker_table, rx, steer);
            })
            .map_err(|e| DataplaneError::io("spawning the least-connection worker", e))?;
        let events = EventStream::start(move |update| {
            // Unmarked connections are not a least-connection target's.
            if !matches!(&update, CtUpdate::Event(ev) if ev.mark == 0) {
                let _ = tx.send(update);
            }
        })?;
        Ok(LeastConn {
            table,
            _events: events,
        })
    }

    /// The table, locked. Backends hold it while they sync so that a pick never races a rebuild.
    pub fn lock(&self) -> MutexGuard<'_, LcTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A live view of the counts for `proxy inspect`.
    pub fn live_view(&self) -> Arc<dyn LiveView> {
        Arc::new(LcView(Arc::clone(&self.table)))
    }
}

/// Applies picks after each batch of events (events are drained first, so a burst costs one
/// dataplane update), and when a burst ends.
fn run_worker(table: &Mutex<LcTable>, rx: Receiver<CtUpdate>, mut steer: Box<dyn Steer>) {
    loop {
        let burst_end = table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_burst_end();
        let first = match burst_end {
            None => match rx.recv() {
                Ok(u) => Some(u),
                Err(_) => return,
            },
            Some(end) => match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(u) => Some(u),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
        let mut changes: BTreeMap<u32, PickChange> = BTreeMap::new();
        let now = Instant::now();
        let mut moves = t.end_bursts(now);
        for update in first.into_iter().chain(rx.try_iter()) {
            moves.extend(match &update {
                CtUpdate::Event(ev) => t.on_event(ev, now),
                CtUpdate::Snapshot(entries) => t.recount(entries),
            });
        }
        for c in moves {
            changes
                .entry(c.id)
                .and_modify(|prev| prev.new = c.new.clone())
                .or_insert(c);
        }
        let changes: Vec<PickChange> = changes.into_values().filter(|c| c.old != c.new).collect();
        if changes.is_empty() {
            continue;
        }
        if let Err(e) = steer.steer(&changes) {
            tracing::warn!("least-connection: moving picks failed: {e}");
            // The dataplane state is unknown: program every pick again on the next change.
            t.forget_programmed();
        }
    }
}

struct LcView(Arc<Mutex<LcTable>>);

impl LiveView for LcView {
    fn active_connections(&self) -> BTreeMap<SocketAddr, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(n: u8) -> SocketAddr {
        SocketAddr::new([10, 244, n, 2].into(), 8080)
    }

    fn new(id: u32, mark: u32, e: SocketAddr) -> CtEvent {
        CtEvent {
            kind: CtEventKind::New,
            id,
            mark,
            protocol: 6,
            endpoint: Some(e),
            tcp_state: Some(1),
        }
    }

    /// `s` seconds into a test: events that far apart are never a burst.
    fn at(s: u64) -> Instant {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_secs(s)
    }

    fn destroy(id: u32, e: SocketAddr) -> CtEvent {
        CtEvent {
            kind: CtEventKind::Destroy,
            tcp_state: None,
            ..new(id, 1, e)
        }
    }

    #[test]
    fn picks_are_every_endpoint_tied_for_least_and_load_is_avoided() {
        let mut t = LcTable::default();
        let first = t.set_target(1, "svc", &[ep(1), ep(2), ep(3)]).unwrap();
        assert_eq!(
            first.new,
            [ep(1), ep(2), ep(3)],
            "idle: a burst spreads over all"
        );
        let c = t.on_event(&new(100, 1, ep(1)), at(1));
        assert_eq!(c[0].new, [ep(2), ep(3)]);
        let c = t.on_event(&new(101, 1, ep(2)), at(2));
        assert_eq!(c[0].new, [ep(3)]);
        // Connection 100 closes: ep(1) is free again, after ep(3) in round-robin order.
        let c = t.on_event(&destroy(100, ep(1)), at(3));
        assert_eq!(c[0].new, [ep(3), ep(1)]);
        let c = t.on_event(&new(102, 1, ep(3)), at(4));
        assert_eq!(c[0].new, [ep(1)]);
        assert_eq!(t.counts().values().sum::<u64>(), 2);
        assert_eq!(t.picks(1), [ep(1)]);
    }

    #[test]
    fn a_snapshot_after_lost_events_replaces_the_counts() {
        let mut t = LcTable::default();
        t.set_target(1, "svc", &[ep(1), ep(2)]);
        t.on_event(&new(100, 1, ep(1)), at(5));
        t.on_event(&new(101, 1, ep(1)), at(6));
        // The close of 100 and the open of 102 were lost; the table holds 101 and 102.
        let c = t.recount(&[new(101, 1, ep(1)), new(102, 1, ep(2)), new(103, 9, ep(2))]);
        assert_eq!(
            c[0].new,
            [ep(2), ep(1)],
            "one each: tied, round-robin from after ep(1)"
        );
        assert_eq!(
            t.counts().values().sum::<u64>(),
            2,
            "the unknown target's 103 is not counted"
        );
        let c = t.recount(&[new(102, 1, ep(2))]);
        assert_eq!(c[0].new, [ep(1)]);
    }

    #[test]
    fn events_of_unknown_targets_are_not_counted() {
        let mut t = LcTable::default();
        t.set_target(1, "svc", &[ep(1)]);
        assert!(t.on_event(&new(5, 2, ep(1)), at(7)).is_empty());
        assert!(t.counts().is_empty());
    }

    #[test]
    fn removing_a_programmed_target_removes_its_pick() {
        let mut t = LcTable::default();
        t.set_target(4, "svc", &[ep(1)]);
        let c = t.remove_target(4).unwrap();
        assert_eq!((c.old, c.new), (vec![ep(1)], vec![]));
    }

    #[test]
    fn a_burst_spreads_over_every_endpoint_until_it_ends() {
        let mut t = LcTable::default();
        t.set_target(1, "svc", &[ep(1), ep(2), ep(3), ep(4)]);
        let c = t.on_event(&new(100, 1, ep(1)), at(1));
        assert_eq!(c[0].new, [ep(2), ep(3), ep(4)], "one connection: exact");
        let soon = at(1) + BURST_WINDOW / 4;
        let c = t.on_event(&new(101, 1, ep(2)), soon);
        assert_eq!(
            c[0].new,
            [ep(3), ep(4), ep(1), ep(2)],
            "a second one within the window: every endpoint, round-robin from the cursor"
        );
        assert!(
            t.on_event(&new(102, 1, ep(3)), soon).is_empty(),
            "still every endpoint"
        );
        let end = t.next_burst_end().expect("a burst is on");
        assert_eq!(end, soon + BURST_WINDOW);
        assert!(t.end_bursts(end - Duration::from_millis(1)).is_empty());
        let c = t.end_bursts(end);
        assert_eq!(c[0].new, [ep(4)], "after the burst: the least loaded again");
        assert_eq!(t.next_burst_end(), None);
        // A connection a window later is not a burst.
        let c = t.on_event(&new(103, 1, ep(4)), end + BURST_WINDOW);
        assert_eq!(c[0].new, [ep(1), ep(2), ep(3), ep(4)], "all tied at one");
        assert_eq!(t.next_burst_end(), None);
    }
}
