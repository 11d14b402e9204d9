//! The rule backends' [`Dataplane`]: one sync skeleton around a backend's plan and apply.
//!
//! Owns the order of a sync and what a failure forgets: least-connection starts with the first
//! least-connection Service port; the plan is made with the least-connection table locked (so
//! the controller never moves a pick the same transaction writes); a failed apply makes the next
//! sync a full one and forgets which picks are programmed; stale UDP conntrack entries are
//! removed after a successful apply. Owns [`RuleBackend`], what a backend provides for that. Must
//! not know either backend's syntax.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::conntrack::leastconn::{LcTable, LeastConn, Steer};
use crate::dataplane::{BackendConfig, Dataplane};
use crate::error::DataplaneError;
use crate::model::{Algorithm, IpFamily};
use crate::state::{ChangeSet, LiveView, ProxyState, SyncStats};

/// One planned transaction and what it will do.
#[derive(Debug)]
pub struct Planned<T> {
    /// Whether the plan rebuilds everything.
    pub full: bool,
    /// Service ports it touches.
    pub touched: usize,
    pub transaction: T,
}

/// What a rule backend provides to [`RuleDataplane`].
pub trait RuleBackend: Send + Sized + 'static {
    /// The backend's name as `--backend` spells it.
    const NAME: &'static str;
    /// One planned transaction (an nft script's operations, an iptables-restore input).
    type Transaction;

    fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError>;

    /// Plans a sync of `changes`, or of everything when `full` (the backend may also decide on a
    /// full sync itself, when its fixed rules changed), and updates its bookkeeping as if the
    /// plan was applied. With least-connection running, `lc` is the locked table: the backend
    /// registers its least-connection targets with [`LcTable::reconcile`] and programs their
    /// picks in the same transaction.
    fn plan(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        full: bool,
        lc: Option<&mut LcTable>,
    ) -> Result<Planned<Self::Transaction>, DataplaneError>;

    /// Applies a planned transaction; returns the number of dataplane operations it held.
    fn apply(&mut self, planned: Planned<Self::Transaction>) -> Result<usize, DataplaneError>;

    /// How the least-connection controller moves a pick in this backend's dataplane.
    fn steer(&self) -> Box<dyn Steer>;

    /// Service ports programmed.
    fn service_ports(&self) -> usize;

    /// The address families it programs.
    fn families(&self) -> &'static [IpFamily] {
        &[IpFamily::V4]
    }

    /// Removes everything this backend installed.
    fn cleanup(&mut self) -> Result<(), DataplaneError>;
}

/// A rule backend as a [`Dataplane`]. Dereferences to the backend, for its own inspection
/// methods.
pub struct RuleDataplane<B> {
    backend: B,
    lc: Option<LeastConn>,
    /// The last apply failed: the next sync rebuilds everything.
    needs_full: bool,
}

impl<B: RuleBackend> RuleDataplane<B> {
    pub fn new(cfg: &BackendConfig) -> Result<Self, DataplaneError> {
        Ok(Self::from_backend(B::new(cfg)?))
    }

    /// Around a backend built by other means (another family's instance).
    pub fn from_backend(backend: B) -> Self {
        RuleDataplane {
            backend,
            lc: None,
            needs_full: true,
        }
    }
}

impl<B> Deref for RuleDataplane<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.backend
    }
}

impl<B> DerefMut for RuleDataplane<B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.backend
    }
}

/// Whether a service port asks for least-connection: on a full sync, any of them; on an
/// incremental one only the changed ports can have started to (walking 20,000 ports on every
/// one-endpoint change cost about 0.1 ms of its 0.6).
fn wants_least_conn(state: &ProxyState, changes: &ChangeSet, full: bool) -> bool {
    let lc = |p: &crate::state::PortState| p.service.algorithm == Algorithm::LeastConn;
    if full {
        state.iter().any(|(_, p)| lc(p))
    } else {
        changes
            .changed
            .iter()
            .any(|spn| state.get(spn).is_some_and(lc))
    }
}

impl<B: RuleBackend> Dataplane for RuleDataplane<B> {
    fn name(&self) -> &'static str {
        B::NAME
    }

    fn families(&self) -> &'static [IpFamily] {
        self.backend.families()
    }

    fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
    ) -> Result<SyncStats, DataplaneError> {
        if self.lc.is_none() && wants_least_conn(state, changes, changes.full || self.needs_full) {
            match LeastConn::start(self.backend.steer()) {
                Ok(lc) => self.lc = Some(lc),
                Err(e) => {
                    self.needs_full = true;
                    return Err(e);
                }
            }
        }
        let mut table = self.lc.as_ref().map(LeastConn::lock);
        let full = changes.full || self.needs_full;
        let started = std::time::Instant::now();
        let result = self
            .backend
            .plan(state, changes, full, table.as_deref_mut())
            .and_then(|planned| {
                let (full, touched) = (planned.full, planned.touched);
                let planned_in = started.elapsed();
                let operations = self.backend.apply(planned)?;
                if full {
                    // Where a full sync's time goes: the agent's planning, or the kernel's tools
                    // (nft, iptables-restore) taking the transaction.
                    tracing::info!(
                        service_ports = touched,
                        operations,
                        plan_ms = planned_in.as_secs_f64() * 1e3,
                        apply_ms = (started.elapsed() - planned_in).as_secs_f64() * 1e3,
                        "{}: full sync",
                        B::NAME
                    );
                }
                Ok((full, touched, operations))
            });
        if result.is_err() {
            // What the kernel holds is unknown: every pick is programmed again with the rebuild.
            if let Some(t) = table.as_mut() {
                t.forget_programmed();
            }
        }
        drop(table);
        let (full, touched, operations) = match result {
            Ok(done) => done,
            Err(e) => {
                self.needs_full = true;
                return Err(e);
            }
        };
        self.needs_full = false;
        match crate::conntrack::cleanup_stale(state, changes, self.backend.families()) {
            Ok(0) => {}
            Ok(n) => tracing::debug!("{}: deleted {n} stale conntrack entries", B::NAME),
            Err(e) => tracing::warn!("{}: stale conntrack cleanup failed: {e}", B::NAME),
        }
        Ok(SyncStats {
            full,
            service_ports: self.backend.service_ports(),
            touched,
            operations,
            ..SyncStats::default()
        })
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        self.lc = None;
        self.needs_full = true;
        self.backend.cleanup()
    }

    fn live_view(&self) -> Option<Arc<dyn LiveView>> {
        self.lc.as_ref().map(LeastConn::live_view)
    }
}
