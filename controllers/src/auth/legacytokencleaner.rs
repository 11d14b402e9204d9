//! The legacy service-account token cleaner (kube-controller-manager v1.34's
//! `legacy-serviceaccount-token-cleaner-controller`, alias
//! `legacy-service-account-token-cleaner`,
//! `pkg/controller/serviceaccount/legacy_serviceaccount_token_cleaner.go`; on by default): once a
//! day (the first look at start) it looks at every `kubernetes.io/service-account-token` Secret
//! and, for an auto-generated one (its ServiceAccount lists it in `secrets`) created and last
//! used (`kubernetes.io/legacy-token-last-used`, a date the API server writes) more than
//! `--legacy-service-account-token-clean-up-period` ago (a year) and mounted by no Pod of its
//! namespace, first labels it `kubernetes.io/legacy-token-invalid-since: <today>` (the API
//! server then refuses it), then deletes it once that date is a period old. Nothing is done
//! until the API server has tracked token use for a whole period (the date of the
//! `kube-apiserver-legacy-service-account-token-tracking` ConfigMap of `kube-system`).
//!
//! Owns: that label (a merge patch carrying the Secret's UID) and the deletion of those Secrets
//! (with their resourceVersion as a precondition). No work queue (upstream has none); a failed
//! write is logged and tried again at the next look.
//!
//! Difference from upstream: the Pods mounting a Secret are listed from the API server (one list
//! per namespace with a candidate, at most once a day), because the controller-manager's Pod
//! cache keeps no volumes; upstream reads its Pod informer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};

use crate::helpers::clock::{Clock, SystemClock};
use crate::runtime::apierrors;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::workers::wait_for_caches;

/// The controller's name in logs.
pub const NAME: &str = "legacy-serviceaccount-token-cleaner";
/// How often every token is looked at (`DefaultCleanerSyncInterval`).
pub const SYNC_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// `--legacy-service-account-token-clean-up-period`'s default.
pub const DEFAULT_CLEAN_UP_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);
/// The labels the API server and this controller write (`pkg/serviceaccount/legacy.go`).
pub const LAST_USED_LABEL: &str = "kubernetes.io/legacy-token-last-used";
pub const INVALID_SINCE_LABEL: &str = "kubernetes.io/legacy-token-invalid-since";
/// The API server's record of when it started tracking token use (`legacytokentracking`).
pub const TRACKING_CONFIG_MAP: &str = "kube-apiserver-legacy-service-account-token-tracking";
pub const TRACKING_KEY: &str = "since";

const SECRET_TYPE: &str = "kubernetes.io/service-account-token";
const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// The controller's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--legacy-service-account-token-clean-up-period`.
    pub clean_up_period: Duration,
    /// How often to look (`SyncInterval`).
    pub sync_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            clean_up_period: DEFAULT_CLEAN_UP_PERIOD,
            sync_interval: SYNC_INTERVAL,
        }
    }
}

/// A UTC date as upstream formats it (`2006-01-02`).
pub fn date(t: Timestamp) -> String {
    t.to_zoned(TimeZone::UTC).date().to_string()
}

fn label<'a>(s: &'a Secret, key: &str) -> Option<&'a str> {
    s.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// `latestPossibleTrackedSinceTime`: 00:00 UTC the day after the ConfigMap's date.
pub fn tracked_since(cm: &ConfigMap) -> Result<Timestamp, String> {
    let since = cm
        .data
        .as_ref()
        .and_then(|d| d.get(TRACKING_KEY))
        .ok_or("configMap does not have since label")?;
    let day: Date = since
        .parse()
        .map_err(|e| format!("error parsing trackedSince time: {e}"))?;
    day.tomorrow()
        .and_then(|d| d.to_zoned(TimeZone::UTC))
        .map(|z| z.timestamp())
        .map_err(|e| e.to_string())
}

/// Whether tracking has gone on for a whole period at `now`.
pub fn tracked_long_enough(tracked_since: Timestamp, now: Timestamp, period: Duration) -> bool {
    now.as_second() >= tracked_since.as_second() + period.as_secs() as i64
}

/// The first checks of `evaluateSATokens` on one Secret, before its account and Pods are looked
/// at: a token Secret, created more than a period before `now`, not being deleted, and not used
/// on or after the day a period before `now` (without a last-used label it counts as unused; an
/// unreadable one keeps it).
pub fn candidate(s: &Secret, now: Timestamp, period: Duration) -> bool {
    let limit = now.as_second() - period.as_secs() as i64;
    if s.type_.as_deref() != Some(SECRET_TYPE)
        || s.metadata.deletion_timestamp.is_some()
        || s.metadata
            .creation_timestamp
            .as_ref()
            .is_none_or(|t| t.0.as_second() >= limit)
    {
        return false;
    }
    match label(s, LAST_USED_LABEL) {
        None => true,
        Some(used) => {
            used.parse::<Date>().is_ok()
                && used < date(Timestamp::from_second(limit).unwrap_or(now)).as_str()
        }
    }
}

/// Whether `sa` is the Secret's account (its name and, when annotated, UID) and lists it: an
/// auto-generated token.
pub fn auto_generated(s: &Secret, sa: Option<&ServiceAccount>) -> bool {
    let Some(sa) = sa else { return false };
    let uid = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(UID_ANNOTATION))
        .map(String::as_str)
        .unwrap_or_default();
    let name = s.metadata.name.as_deref();
    (uid.is_empty() || sa.metadata.uid.as_deref() == Some(uid))
        && sa
            .secrets
            .iter()
            .flatten()
            .any(|r| r.name.as_deref() == name)
}

/// What to do with an unused, unmounted auto-generated token.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Label it invalid since this date.
    Label(String),
    /// Delete it.
    Delete,
    /// Invalid for less than a period: wait.
    Wait,
}

/// The end of `evaluateSATokens` for one Secret.
pub fn action(s: &Secret, now: Timestamp, period: Duration) -> Action {
    match label(s, INVALID_SINCE_LABEL).filter(|d| d.parse::<Date>().is_ok()) {
        None => Action::Label(date(now)),
        Some(since) => {
            let limit =
                Timestamp::from_second(now.as_second() - period.as_secs() as i64).unwrap_or(now);
            if since >= date(limit).as_str() {
                Action::Wait
            } else {
                Action::Delete
            }
        }
    }
}

/// `podutil.VisitPodSecretNames`: every Secret a Pod names.
pub fn pod_secret_names(pod: &Pod) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(spec) = &pod.spec else { return out };
    let mut add = |n: Option<&String>| {
        if let Some(n) = n.filter(|n| !n.is_empty()) {
            out.insert(n.clone());
        }
    };
    for r in spec.image_pull_secrets.iter().flatten() {
        add(Some(&r.name));
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let ephemeral = spec.ephemeral_containers.iter().flatten();
    let envs = containers
        .map(|c| (&c.env, &c.env_from))
        .chain(ephemeral.map(|c| (&c.env, &c.env_from)));
    for (env, env_from) in envs {
        for e in env_from.iter().flatten() {
            add(e.secret_ref.as_ref().map(|r| &r.name));
        }
        for e in env.iter().flatten() {
            let r = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref());
            add(r.map(|r| &r.name));
        }
    }
    for v in spec.volumes.iter().flatten() {
        add(v.secret.as_ref().and_then(|s| s.secret_name.as_ref()));
        add(v.azure_file.as_ref().map(|a| &a.secret_name));
        add(v
            .cephfs
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v
            .cinder
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v
            .flex_volume
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v
            .rbd
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v
            .iscsi
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v.scale_io.as_ref().map(|c| &c.secret_ref.name));
        add(v
            .storageos
            .as_ref()
            .and_then(|c| c.secret_ref.as_ref())
            .map(|r| &r.name));
        add(v
            .csi
            .as_ref()
            .and_then(|c| c.node_publish_secret_ref.as_ref())
            .map(|r| &r.name));
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            add(p.secret.as_ref().map(|s| &s.name));
        }
    }
    out
}

/// The running controller.
pub struct Controller {
    client: Client,
    config: Config,
    accounts: Arc<Indexed<ServiceAccount>>,
    secrets: Arc<Indexed<Secret>>,
    clock: Arc<dyn Clock>,
}

impl Controller {
    /// Uses the shared ServiceAccount and Secret caches (no handler: the cleaner polls).
    pub fn new(client: Client, informers: &Informers, config: Config) -> Arc<Controller> {
        Arc::new(Controller {
            client,
            config,
            accounts: informers.get::<ServiceAccount>().cache(),
            secrets: informers.get::<Secret>().cache(),
            clock: Arc::new(SystemClock),
        })
    }

    /// Waits for the caches, then looks every [`Config::sync_interval`].
    pub async fn run(self: Arc<Self>) {
        wait_for_caches(NAME, &[&*self.accounts, &*self.secrets]).await;
        let mut tick = tokio::time::interval(self.config.sync_interval);
        loop {
            tick.tick().await;
            self.evaluate().await;
        }
    }

    /// `evaluateSATokens`: one look at every token.
    pub async fn evaluate(&self) {
        let now = self.clock.now();
        let period = self.config.clean_up_period;
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), "kube-system");
        let since = match cms.get(TRACKING_CONFIG_MAP).await {
            Ok(cm) => tracked_since(&cm),
            Err(e) => Err(e.to_string()),
        };
        match since {
            Err(e) => {
                tracing::error!(
                    controller = NAME,
                    "getting the latest possible tracked_since time: {e}"
                );
                return;
            }
            Ok(since) if !tracked_long_enough(since, now, period) => return,
            Ok(_) => {}
        }
        let mut mounted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in self.secrets.all() {
            if !candidate(&s, now, period) {
                continue;
            }
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            let name = s.metadata.name.clone().unwrap_or_default();
            let sa_name = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NAME_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            let sa = (!sa_name.is_empty())
                .then(|| self.accounts.get(&ns, &sa_name))
                .flatten();
            if !auto_generated(&s, sa.as_deref()) {
                continue;
            }
            if !mounted.contains_key(&ns) {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                match pods.list(&ListParams::default()).await {
                    Ok(list) => {
                        let names = list.items.iter().flat_map(pod_secret_names).collect();
                        mounted.insert(ns.clone(), names);
                    }
                    Err(e) => {
                        tracing::error!(controller = NAME, namespace = ns, "listing Pods: {e}");
                        continue;
                    }
                }
            }
            if mounted[&ns].contains(&name) {
                continue;
            }
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
            match action(&s, now, period) {
                Action::Wait => {}
                Action::Label(day) => {
                    tracing::info!(controller = NAME, secret = %format!("{ns}/{name}"), invalid_since = day, "marking the auto-generated service account token invalid");
                    let patch = serde_json::json!({
                        "kind": "Secret", "apiVersion": "v1",
                        "metadata": {"name": name, "namespace": ns, "uid": s.metadata.uid,
                                     "labels": {INVALID_SINCE_LABEL: day}}});
                    if let Err(e) = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        tracing::error!(controller = NAME, secret = %format!("{ns}/{name}"), "labelling: {e}");
                    }
                }
                Action::Delete => {
                    tracing::info!(controller = NAME, secret = %format!("{ns}/{name}"), "deleting auto-generated service account token");
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: None,
                            resource_version: s.metadata.resource_version.clone(),
                        }),
                        ..Default::default()
                    };
                    match api.delete(&name, &dp).await {
                        Ok(_) => {}
                        Err(e) if apierrors::is_conflict(&e) || apierrors::is_not_found(&e) => {}
                        Err(e) => {
                            tracing::error!(controller = NAME, secret = %format!("{ns}/{name}"), "deleting: {e}")
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DAY: i64 = 24 * 3600;
    const PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

    fn now() -> Timestamp {
        "2026-06-01T12:00:00Z".parse().unwrap()
    }

    fn ago(days: i64) -> String {
        Timestamp::from_second(now().as_second() - days * DAY)
            .unwrap()
            .to_string()
    }

    fn secret(created_days_ago: i64, labels: serde_json::Value) -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns", "creationTimestamp": ago(created_days_ago),
                         "labels": labels,
                         "annotations": {NAME_ANNOTATION: "sa", UID_ANNOTATION: "u1"}},
            "type": SECRET_TYPE}))
        .unwrap()
    }

    fn day(days_ago: i64) -> String {
        date(Timestamp::from_second(now().as_second() - days_ago * DAY).unwrap())
    }

    /// Upstream's `TestLegacyServiceAccountTokenCleanUp` table, as far as the Secret decides.
    #[test]
    fn upstream_cleaner_cases() {
        let n = now();
        // Created recently: kept.
        assert!(!candidate(&secret(30, json!({})), n, PERIOD));
        // Old, never used: a candidate, labelled today.
        let old = secret(400, json!({}));
        assert!(candidate(&old, n, PERIOD));
        assert_eq!(action(&old, n, PERIOD), Action::Label(day(0)));
        // Used within the period: kept; used before it: a candidate.
        assert!(!candidate(
            &secret(400, json!({LAST_USED_LABEL: day(30)})),
            n,
            PERIOD
        ));
        assert!(candidate(
            &secret(800, json!({LAST_USED_LABEL: day(400)})),
            n,
            PERIOD
        ));
        // An unreadable last-used date: kept.
        assert!(!candidate(
            &secret(400, json!({LAST_USED_LABEL: "yesterday"})),
            n,
            PERIOD
        ));
        // Invalid for less than a period: wait; for more: delete; an unreadable label: relabel.
        assert_eq!(
            action(
                &secret(800, json!({INVALID_SINCE_LABEL: day(30)})),
                n,
                PERIOD
            ),
            Action::Wait
        );
        assert_eq!(
            action(
                &secret(800, json!({INVALID_SINCE_LABEL: day(400)})),
                n,
                PERIOD
            ),
            Action::Delete
        );
        assert_eq!(
            action(&secret(800, json!({INVALID_SINCE_LABEL: "bad"})), n, PERIOD),
            Action::Label(day(0))
        );
    }

    #[test]
    fn only_tokens_the_account_lists_are_auto_generated() {
        let s = secret(400, json!({}));
        let sa = |uid: &str, secrets: serde_json::Value| -> ServiceAccount {
            serde_json::from_value(
                json!({"metadata": {"name": "sa", "namespace": "ns", "uid": uid},
                                          "secrets": secrets}),
            )
            .unwrap()
        };
        assert!(auto_generated(&s, Some(&sa("u1", json!([{"name": "t"}])))));
        assert!(!auto_generated(
            &s,
            Some(&sa("u1", json!([{"name": "other"}])))
        ));
        assert!(!auto_generated(&s, Some(&sa("u2", json!([{"name": "t"}])))));
        assert!(!auto_generated(&s, None));
    }

    #[test]
    fn tracking_starts_the_day_after() {
        let cm: ConfigMap =
            serde_json::from_value(json!({"data": {"since": "2025-05-31"}})).unwrap();
        let since = tracked_since(&cm).unwrap();
        assert_eq!(since.to_string(), "2025-06-01T00:00:00Z");
        assert!(tracked_long_enough(since, now(), PERIOD));
        assert!(!tracked_long_enough(
            since,
            "2026-05-31T23:00:00Z".parse().unwrap(),
            PERIOD
        ));
        assert!(tracked_since(&serde_json::from_value(json!({"data": {}})).unwrap()).is_err());
    }

    #[test]
    fn secrets_a_pod_names() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "envfrom"}}],
                            "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "env", "key": "k"}}}]}],
            "volumes": [{"name": "v", "secret": {"secretName": "vol"}},
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "proj"}}]}}]}}))
        .unwrap();
        let want: BTreeSet<String> = ["pull", "envfrom", "env", "vol", "proj"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(pod_secret_names(&pod), want);
    }
}
