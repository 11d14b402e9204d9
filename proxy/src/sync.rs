//! The sync runner: owns the tracker and the dataplane, applies source events, and programs the
//! dataplane at most every `min_sync_period` and at least every `sync_period`, never before the
//! first complete listing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::dataplane::{Dataplane, TraceQuery, TraceView};

use crate::healthcheck::HealthCheckServers;
use crate::metrics::{FamilyLabel, Metrics, TrafficPolicyLabel};
use crate::model::{IpFamily, ServicePortName};
use crate::source::SourceEvent;
use crate::state::ChangeSet;
use crate::status::{service_views, unserved_families, Health, LastSync, StateView};
use crate::tracker::Tracker;

/// Timing of syncs.
#[derive(Debug, Clone, Copy)]
pub struct SyncTiming {
    /// `--min-sync-period`: at most one sync per this period.
    pub min_sync_period: Duration,
    /// `--sync-period`: a sync at least this often, even without changes.
    pub sync_period: Duration,
    /// A full resync at least this often (recovers from rules changed behind our back).
    pub full_sync_period: Duration,
}

/// A request the HTTP endpoints send the runner (which owns the dataplane).
pub enum StateQuery {
    /// `GET /state`: the current [`StateView`].
    State(oneshot::Sender<StateView>),
    /// `GET /trace`: the dataplane's own decision for a new connection.
    Trace(TraceQuery, oneshot::Sender<Result<TraceView, String>>),
}

pub struct Runner {
    tracker: Tracker,
    dataplane: Box<dyn Dataplane>,
    timing: SyncTiming,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    healthchecks: HealthCheckServers,
    synced: bool,
    /// When the initial listing completed, until the first sync after it succeeds.
    listed_at: Option<Instant>,
    last_sync: Option<Instant>,
    last_full: Option<Instant>,
    pending_since: Option<Instant>,
    /// Syncs failed in a row: the retry backs off exponentially up to `sync_period`.
    failures: u32,
    last_result: Option<LastSync>,
    no_local_internal: BTreeSet<ServicePortName>,
    no_local_external: BTreeSet<ServicePortName>,
    /// The families not served (backend or node), and per family the ports with addresses of it.
    unserved: Vec<(IpFamily, String)>,
    unserved_ports: BTreeMap<IpFamily, BTreeSet<ServicePortName>>,
}

impl Runner {
    pub fn new(
        tracker: Tracker,
        dataplane: Box<dyn Dataplane>,
        timing: SyncTiming,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        Runner {
            tracker,
            dataplane,
            timing,
            metrics,
            health,
            healthchecks: HealthCheckServers::default(),
            synced: false,
            listed_at: None,
            last_sync: None,
            last_full: None,
            pending_since: None,
            failures: 0,
            last_result: None,
            no_local_internal: BTreeSet::new(),
            no_local_external: BTreeSet::new(),
            unserved: Vec::new(),
            unserved_ports: BTreeMap::new(),
        }
    }

    /// Runs until the event channel closes and no query can arrive any more.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<SourceEvent>,
        mut queries: mpsc::Receiver<StateQuery>,
    ) {
        let mut events_open = true;
        loop {
            let deadline = tokio::time::Instant::from_std(self.next_deadline());
            tokio::select! {
                ev = events.recv(), if events_open => match ev {
                    Some(ev) => {
                        self.apply(ev);
                        while let Ok(ev) = events.try_recv() {
                            self.apply(ev);
                        }
                    }
                    None => {
                        tracing::error!("the source stopped; keeping the last programmed state");
                        events_open = false;
                    }
                },
                q = queries.recv() => match q {
                    Some(StateQuery::State(reply)) => { let _ = reply.send(self.view()); }
                    Some(StateQuery::Trace(q, reply)) => { let _ = reply.send(self.dataplane.trace(&q)); }
                    None if !events_open => return,
                    None => {}
                },
                _ = tokio::time::sleep_until(deadline) => self.sync(),
            }
        }
    }

    fn apply(&mut self, ev: SourceEvent) {
        if ev.apply(&mut self.tracker) && !self.synced {
            tracing::info!("initial listing complete; programming the dataplane");
            self.synced = true;
            self.listed_at = Some(Instant::now());
            self.health.set_synced();
        }
        if self.tracker.has_changes() && self.pending_since.is_none() {
            self.pending_since = Some(Instant::now());
            self.health.queued();
            self.metrics.last_queued_timestamp.set(unix_now());
        }
    }

    fn next_deadline(&self) -> Instant {
        let now = Instant::now();
        if !self.synced {
            return now + Duration::from_secs(3600);
        }
        match self.last_sync {
            None => now,
            Some(last) if self.tracker.has_changes() => (last + self.retry_delay()).max(now),
            Some(last) => last + self.timing.sync_period,
        }
    }

    fn retry_delay(&self) -> Duration {
        let backoff = self.timing.min_sync_period.max(Duration::from_millis(100))
            * 2u32.saturating_pow(self.failures.min(10));
        if self.failures == 0 {
            self.timing.min_sync_period
        } else {
            backoff.min(self.timing.sync_period)
        }
    }

    fn sync(&mut self) {
        if self
            .last_full
            .is_none_or(|t| t.elapsed() >= self.timing.full_sync_period)
        {
            self.tracker.request_full();
        }
        let start = Instant::now();
        let changes = self.tracker.take_changes();
        let result =
            tokio::task::block_in_place(|| self.dataplane.sync(self.tracker.state(), &changes));
        let took = start.elapsed();
        self.last_sync = Some(Instant::now());
        let mut last = LastSync::now(took, changes.full);
        match result {
            Ok(stats) => {
                last.touched = stats.touched;
                last.operations = stats.operations;
                self.metrics.count_destroyed(&stats.sockets_destroyed);
                self.failures = 0;
                self.record_success(&changes, took);
                if let Some(listed) = self.listed_at.take() {
                    tracing::info!(
                        service_ports = stats.service_ports,
                        sync_ms = took.as_secs_f64() * 1e3,
                        "initial listing programmed {:.0} ms after it completed",
                        listed.elapsed().as_secs_f64() * 1e3
                    );
                }
                tracing::debug!(
                    full = changes.full,
                    touched = stats.touched,
                    ops = stats.operations,
                    ms = took.as_secs_f64() * 1e3,
                    "synced"
                );
            }
            Err(e) => {
                tracing::error!("sync failed, the next one is a full resync: {e}");
                last.error = Some(e.to_string());
                self.metrics.sync_errors_total.inc();
                if let crate::error::DataplaneError::MapFull { map, .. } = &e {
                    let label = crate::metrics::MapLabel { map: map.clone() };
                    self.metrics.map_full_total.get_or_create(&label).inc();
                }
                self.failures += 1;
                self.tracker.request_full();
            }
        }
        self.last_result = Some(last);
        if changes.full {
            // What the pass and the listing before it freed goes back (see `allocator`).
            drop(changes);
            let start = Instant::now();
            tokio::task::block_in_place(crate::allocator::trim);
            tracing::debug!(
                ms = start.elapsed().as_secs_f64() * 1e3,
                "allocator trimmed"
            );
        }
    }

    fn record_success(&mut self, changes: &ChangeSet, took: Duration) {
        if changes.full {
            self.last_full = Some(Instant::now());
            self.metrics.sync_full_duration.observe(took.as_secs_f64());
        } else {
            self.metrics
                .sync_partial_duration
                .observe(took.as_secs_f64());
        }
        self.metrics.sync_duration.observe(took.as_secs_f64());
        if let Some(since) = self.pending_since.take() {
            self.metrics
                .network_programming_duration
                .observe(since.elapsed().as_secs_f64());
        }
        self.health.programmed();
        self.metrics.last_sync_timestamp.set(unix_now());
        let state = self.tracker.state();
        self.metrics
            .service_changes_total
            .inc_by(changes.changed.len() as u64);
        self.metrics.endpoint_changes_total.inc_by(
            changes
                .removed_endpoints
                .values()
                .map(Vec::len)
                .sum::<usize>() as u64,
        );
        self.metrics.service_ports.set(state.len() as i64);
        self.metrics
            .endpoints
            .set(state.iter().map(|(_, p)| p.endpoints.len()).sum::<usize>() as i64);
        self.metrics
            .invalid_objects
            .set(self.tracker.errors().count() as i64);
        self.update_no_local(changes);
        self.update_unserved(changes);
        self.healthchecks.update(self.tracker.state());
    }

    /// Keeps the unserved-family gauges and warns of newly unserved ports, touching only the
    /// changed service ports unless the node itself changed or the sync is full. A port is
    /// warned of once, when it becomes unserved (not again on each full resync), and many ports
    /// at once (a node without IPv6 and 20,000 dual-stack Services) make one line, not one each.
    fn update_unserved(&mut self, changes: &ChangeSet) {
        let state = self.tracker.state();
        let unserved = unserved_families(
            self.dataplane.name(),
            self.dataplane.families(),
            &state.node,
        );
        let reasons_changed = unserved != self.unserved;
        if reasons_changed {
            self.unserved = unserved;
            self.unserved_ports.clear();
        }
        let all = changes.full || reasons_changed;
        if all {
            for set in self.unserved_ports.values_mut() {
                set.retain(|name| state.contains(name));
            }
        }
        let names: Vec<ServicePortName> = if all {
            state.names().cloned().collect()
        } else {
            changes.changed.iter().cloned().collect()
        };
        let mut newly: BTreeMap<IpFamily, Vec<ServicePortName>> = BTreeMap::new();
        for name in names {
            let sp = state.service(&name);
            for (family, _) in &self.unserved {
                let member = sp.is_some_and(|sp| sp.has_family(*family));
                let set = self.unserved_ports.entry(*family).or_default();
                if member && set.insert(name.clone()) {
                    newly.entry(*family).or_default().push(name.clone());
                } else if !member {
                    set.remove(&name);
                }
            }
        }
        for (family, why) in &self.unserved {
            if let Some(names) = newly.get(family) {
                warn_unserved(*family, why, names);
            }
        }
        for family in IpFamily::ALL {
            let n = self.unserved_ports.get(&family).map_or(0, BTreeSet::len);
            self.metrics
                .unserved
                .get_or_create(&FamilyLabel {
                    family: family.to_string(),
                })
                .set(n as i64);
        }
    }

    /// Keeps kube-proxy's "no local endpoints" gauges, touching only the changed service ports.
    fn update_no_local(&mut self, changes: &ChangeSet) {
        let state = self.tracker.state();
        let names: Vec<ServicePortName> = if changes.full {
            state.names().cloned().collect()
        } else {
            changes.changed.iter().cloned().collect()
        };
        if changes.full {
            self.no_local_internal.clear();
            self.no_local_external.clear();
        }
        for name in names {
            let port = state.get(&name);
            set_member(
                &mut self.no_local_internal,
                &name,
                port.is_some_and(|p| p.service.internal_local && p.selected.cluster.is_empty()),
            );
            set_member(
                &mut self.no_local_external,
                &name,
                port.is_some_and(|p| p.service.external_local && p.selected.external.is_empty()),
            );
        }
        for (policy, set) in [
            ("internal", &self.no_local_internal),
            ("external", &self.no_local_external),
        ] {
            self.metrics
                .no_local_endpoints
                .get_or_create(&TrafficPolicyLabel {
                    traffic_policy: policy.into(),
                })
                .set(set.len() as i64);
        }
    }

    fn view(&self) -> StateView {
        let live = self.dataplane.live_view();
        let active = live
            .as_ref()
            .map(|l| l.active_connections())
            .unwrap_or_default();
        StateView {
            backend: self.dataplane.name().to_string(),
            synced: self.synced,
            pending: self.tracker.has_changes(),
            last_sync: self.last_result.clone(),
            services: service_views(
                self.tracker.state(),
                &active,
                live.is_some(),
                &self.unserved,
            ),
            errors: self.tracker.errors().map(|e| e.to_string()).collect(),
        }
    }
}

fn set_member(set: &mut BTreeSet<ServicePortName>, name: &ServicePortName, member: bool) {
    if member {
        set.insert(name.clone());
    } else {
        set.remove(name);
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How many newly unserved ports a warning names one by one before it summarizes.
const UNSERVED_NAMED: usize = 3;

/// The warning for service ports whose `family` addresses became unserved.
fn warn_unserved(family: IpFamily, why: &str, names: &[ServicePortName]) {
    if names.len() <= UNSERVED_NAMED {
        for name in names {
            tracing::warn!("Service port {name}: its {family} addresses are not served: {why}");
        }
        return;
    }
    let first: Vec<String> = names[..UNSERVED_NAMED]
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::warn!(
        "{} Service ports: their {family} addresses are not served: {why} (first: {}; \
         `proxy inspect` lists every one)",
        names.len(),
        first.join(", ")
    );
}
