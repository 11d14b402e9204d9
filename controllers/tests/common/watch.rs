//! The watches of one scenario's namespace feeding a suite's model: a [`Recorder`] is given one
//! watch per kind with the function that applies its events to the model, and started into a
//! [`Watched`] model behind a lock, with a change signal and a bounded wait for a state.
//!
//! Owns: the task that drives the watches (aborted when the [`Watched`] is dropped). Every event
//! is applied under the model's lock in the order its watch delivered it; the watches of
//! different kinds are separate streams, so only resourceVersions order events across kinds.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::Api;

/// What a suite's model must offer the watches.
pub trait Model: Send + 'static {
    /// Records a watch error (a reconnect); failure messages show them.
    fn watch_error(&mut self, error: String);
    /// Called after every event is applied (a change counter, invariants checked at every
    /// observed state).
    fn after_event(&mut self) {}
}

/// How one watch's item went.
enum Step {
    Changed,
    /// The watch's first list is complete.
    Listed,
}

/// The watches to start, each with the function applying its events.
pub struct Recorder<S> {
    state: Arc<Mutex<S>>,
    streams: Vec<BoxStream<'static, Step>>,
}

impl<S: Model> Recorder<S> {
    pub fn new(state: S) -> Recorder<S> {
        Recorder {
            state: Arc::new(Mutex::new(state)),
            streams: Vec::new(),
        }
    }

    /// Watches what `api` lists (default watcher config, default backoff); `on` applies each
    /// event to the model, `Init` and `InitDone` of every relist included.
    pub fn watch<K>(
        &mut self,
        api: Api<K>,
        mut on: impl FnMut(&mut S, Event<K>) + Send + 'static,
    ) -> &mut Self
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + 'static,
    {
        let state = self.state.clone();
        let mut listed = false;
        let stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |item| {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                let first_list = matches!(item, Ok(Event::InitDone)) && !listed;
                match item {
                    Ok(event) => on(&mut s, event),
                    Err(e) => s.watch_error(e.to_string()),
                }
                s.after_event();
                if first_list {
                    listed = true;
                    Step::Listed
                } else {
                    Step::Changed
                }
            })
            .boxed();
        self.streams.push(stream);
        self
    }

    /// Starts the watches; returns once each has listed, at most `wait`.
    pub async fn start(self, wait: Duration) -> anyhow::Result<Watched<S>> {
        let Recorder { state, streams } = self;
        let watches = streams.len();
        let changed = tokio::sync::watch::channel(0u64).0;
        let signal = changed.clone();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut all = futures::stream::select_all(streams);
            let mut synced_tx = Some(synced_tx);
            let mut listed = 0;
            let mut counter = 0u64;
            while let Some(step) = all.next().await {
                if let Step::Listed = step {
                    listed += 1;
                    if listed == watches {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                counter += 1;
                signal.send_replace(counter);
            }
        });
        tokio::time::timeout(wait, synced_rx)
            .await
            .context("the namespace's watches did not list in time")?
            .context("the watch task ended")?;
        Ok(Watched {
            state,
            changed,
            task,
        })
    }
}

/// A model fed by running watches.
pub struct Watched<S> {
    state: Arc<Mutex<S>>,
    changed: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl<S> Drop for Watched<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S> Watched<S> {
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `check` returns `Some` on the model (re-checked on every event and at least
    /// every 250 ms, for states that change with time alone), at most `wait`. Every two seconds
    /// `alive` is asked whether what is under test still runs; its error ends the wait. On
    /// timeout the error names `what` and shows `describe` of the model as last seen.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        wait: Duration,
        alive: impl Fn() -> anyhow::Result<()>,
        describe: impl Fn(&S) -> String,
        mut check: impl FnMut(&S) -> Option<T>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        let mut rx = self.changed.subscribe();
        let mut alive_checked = Instant::now();
        loop {
            rx.borrow_and_update();
            {
                let s = self.lock();
                if let Some(t) = check(&s) {
                    return Ok(t);
                }
                if start.elapsed() > wait {
                    bail!(
                        "timed out after {wait:?} waiting for {what}; last seen:\n{}",
                        describe(&s)
                    );
                }
            }
            if alive_checked.elapsed() > Duration::from_secs(2) {
                alive_checked = Instant::now();
                alive().with_context(|| format!("while waiting for {what}"))?;
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), rx.changed()).await;
        }
    }
}
