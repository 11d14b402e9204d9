//! The KubeSchedulerConfiguration (`kubescheduler.config.k8s.io/v1`) file and the profiles built
//! from it, as kube-scheduler reads and defaults it:
//!
//! - `profiles[]`: `schedulerName` (default `default-scheduler`, unique), `plugins` per extension
//!   point and `multiPoint` (enabled with weights, disabled, `*`), `pluginConfig[]` args by plugin
//!   name (typed, defaulted and validated per kind: [`plugin_args`](super::plugin_args)),
//!   `percentageOfNodesToScore`;
//! - top level: `parallelism`, `percentageOfNodesToScore`, `podInitialBackoffSeconds`,
//!   `podMaxBackoffSeconds`, `leaderElection`, `clientConnection.qps` and `burst` (the client's
//!   request rate limit; without a qps there is none, where kube-scheduler defaults to 50/s);
//!   fields kube-scheduler has that this scheduler has no use for (the rest of
//!   clientConnection, profiling, ...) are accepted and ignored; `extenders` must be empty (not
//!   supported).
//! - Each profile's plugins are the defaults merged with the profile's sets (upstream's
//!   mergePlugins), then `multiPoint` expanded into every point a plugin implements (upstream's
//!   expandMultiPointPlugins: explicitly configured plugins first, then multiPoint ones, then the
//!   remaining explicit ones).
//!
//! Unknown fields, unknown plugins, a plugin enabled at a point it does not extend, invalid args,
//! and the plugins this scheduler does not build are errors naming the field
//! (`profiles[0].plugins.filter.enabled[1].name`,
//! `profiles[0].pluginConfig[1].args.scoringStrategy.type`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::framework::runtime::Framework;
use super::plugins::unsupported_resource_claims::NOT_BUILT;
use super::queue::Backoff;
use super::registry::{BuildContext, BuildError, Built, Point, Registry, DEFAULT_MULTI_POINT};
use crate::runtime::ratelimit::ClientLimit;

pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";

/// A plugin in a set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginRef {
    pub name: String,
    #[serde(default)]
    pub weight: Option<i32>,
}

/// Enabled and disabled plugins of one extension point.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginSet {
    #[serde(default)]
    pub enabled: Vec<PluginRef>,
    #[serde(default)]
    pub disabled: Vec<PluginRef>,
}

/// `profiles[].plugins`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Plugins {
    #[serde(default)]
    pub multi_point: PluginSet,
    #[serde(default)]
    pub pre_enqueue: PluginSet,
    #[serde(default)]
    pub queue_sort: PluginSet,
    #[serde(default)]
    pub pre_filter: PluginSet,
    #[serde(default)]
    pub filter: PluginSet,
    #[serde(default)]
    pub post_filter: PluginSet,
    #[serde(default)]
    pub pre_score: PluginSet,
    #[serde(default)]
    pub score: PluginSet,
    #[serde(default)]
    pub reserve: PluginSet,
    #[serde(default)]
    pub permit: PluginSet,
    #[serde(default)]
    pub pre_bind: PluginSet,
    #[serde(default)]
    pub bind: PluginSet,
    #[serde(default)]
    pub post_bind: PluginSet,
}

impl Plugins {
    pub fn point(&self, p: Point) -> &PluginSet {
        match p {
            Point::PreEnqueue => &self.pre_enqueue,
            Point::QueueSort => &self.queue_sort,
            Point::PreFilter => &self.pre_filter,
            Point::Filter => &self.filter,
            Point::PostFilter => &self.post_filter,
            Point::PreScore => &self.pre_score,
            Point::Score => &self.score,
            Point::Reserve => &self.reserve,
            Point::Permit => &self.permit,
            Point::PreBind => &self.pre_bind,
            Point::Bind => &self.bind,
            Point::PostBind => &self.post_bind,
        }
    }
}

/// `profiles[].pluginConfig[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginConfig {
    pub name: String,
    #[serde(default)]
    pub args: Option<Value>,
}

/// `profiles[]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileConfig {
    #[serde(default)]
    pub scheduler_name: Option<String>,
    #[serde(default)]
    pub percentage_of_nodes_to_score: Option<i32>,
    #[serde(default)]
    pub plugins: Option<Plugins>,
    #[serde(default)]
    pub plugin_config: Vec<PluginConfig>,
}

/// `leaderElection` (used by the binary as its flags' defaults).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElectionConfig {
    #[serde(default)]
    pub leader_elect: Option<bool>,
    #[serde(default)]
    pub lease_duration: Option<String>,
    #[serde(default)]
    pub renew_deadline: Option<String>,
    #[serde(default)]
    pub retry_period: Option<String>,
    #[serde(default)]
    pub resource_name: Option<String>,
    #[serde(default)]
    pub resource_namespace: Option<String>,
    #[serde(default)]
    pub resource_lock: Option<String>,
}

/// The file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeSchedulerConfiguration {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub parallelism: Option<i32>,
    #[serde(default)]
    pub percentage_of_nodes_to_score: Option<i32>,
    #[serde(default)]
    pub pod_initial_backoff_seconds: Option<i64>,
    #[serde(default)]
    pub pod_max_backoff_seconds: Option<i64>,
    #[serde(default)]
    pub profiles: Vec<ProfileConfig>,
    #[serde(default)]
    pub leader_election: Option<LeaderElectionConfig>,
    #[serde(default)]
    pub extenders: Vec<Value>,
    /// Only `qps` and `burst` are used ([`KubeSchedulerConfiguration::client_limit`]).
    #[serde(default)]
    pub client_connection: Option<Value>,
    // Accepted for compatibility with kube-scheduler's files; nothing here uses them.
    #[serde(default)]
    pub enable_profiling: Option<bool>,
    #[serde(default)]
    pub enable_contention_profiling: Option<bool>,
    #[serde(default)]
    pub delay_cache_until_active: Option<bool>,
    #[serde(default)]
    pub healthz_bind_address: Option<String>,
    #[serde(default)]
    pub metrics_bind_address: Option<String>,
}

impl KubeSchedulerConfiguration {
    /// `clientConnection.qps` and `burst` (default 100, kube-scheduler's) as the client's rate
    /// limit; no qps, or one of 0 or below, is no limit.
    pub fn client_limit(&self) -> Result<ClientLimit, String> {
        let field = |name: &str| self.client_connection.as_ref().and_then(|c| c.get(name));
        let qps = match field("qps") {
            None | Some(Value::Null) => 0.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| format!("clientConnection.qps: {v} is not a number"))?
                as f32,
        };
        let burst = match field("burst") {
            None | Some(Value::Null) => 100,
            Some(v) => v
                .as_u64()
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| format!("clientConnection.burst: {v} is not a count"))?,
        };
        Ok(ClientLimit { qps, burst })
    }
}

/// The configuration this scheduler runs with.
pub struct Config {
    pub profiles: Vec<Arc<Framework>>,
    pub parallelism: usize,
    pub percentage_of_nodes_to_score: u32,
    pub backoff: Backoff,
    pub leader_election: Option<LeaderElectionConfig>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("profiles", &self.profiles)
            .field("parallelism", &self.parallelism)
            .field(
                "percentage_of_nodes_to_score",
                &self.percentage_of_nodes_to_score,
            )
            .finish()
    }
}

/// Reads a KubeSchedulerConfiguration from YAML (or JSON) text.
pub fn parse(text: &str) -> Result<KubeSchedulerConfiguration, String> {
    let value: Value = serde_saphyr::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let value = if value.is_null() {
        Value::Object(Default::default())
    } else {
        value
    };
    let cfg: KubeSchedulerConfiguration = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })?;
    if let Some(v) = cfg.api_version.as_deref() {
        if v != API_VERSION {
            return Err(format!(
                "apiVersion: {v:?} is not supported (only {API_VERSION})"
            ));
        }
    }
    if let Some(k) = cfg.kind.as_deref() {
        if k != "KubeSchedulerConfiguration" {
            return Err(format!("kind: {k:?}, want KubeSchedulerConfiguration"));
        }
    }
    Ok(cfg)
}

/// Upstream's mergePluginSet: the default set without what the custom set disables (`*`: all),
/// default plugins the custom set re-enables replaced in place, then the other custom ones.
fn merge_set(default: &[PluginRef], custom: &PluginSet) -> (Vec<PluginRef>, BTreeSet<String>) {
    let disabled: BTreeSet<String> = custom.disabled.iter().map(|p| p.name.clone()).collect();
    let mut replaced = BTreeSet::new();
    let mut enabled = Vec::new();
    if !disabled.contains("*") {
        for d in default {
            if disabled.contains(&d.name) {
                continue;
            }
            match custom.enabled.iter().position(|c| c.name == d.name) {
                Some(i) => {
                    replaced.insert(i);
                    enabled.push(custom.enabled[i].clone());
                }
                None => enabled.push(d.clone()),
            }
        }
    }
    for (i, c) in custom.enabled.iter().enumerate() {
        if !replaced.contains(&i) {
            enabled.push(c.clone());
        }
    }
    (enabled, disabled)
}

/// Builds one profile's [`Framework`].
pub fn build_profile(
    i: usize,
    p: &ProfileConfig,
    registry: &Registry,
    ctx: &BuildContext,
) -> Result<Framework, String> {
    let at = format!("profiles[{i}]");
    let empty = Plugins::default();
    let custom = p.plugins.as_ref().unwrap_or(&empty);
    // Plugins this scheduler does not build may not be named explicitly.
    for (field, set) in std::iter::once(("multiPoint", &custom.multi_point))
        .chain(Point::ALL.iter().map(|pt| (pt.field(), custom.point(*pt))))
    {
        for (j, e) in set.enabled.iter().enumerate() {
            if NOT_BUILT.contains(&e.name.as_str()) {
                return Err(format!(
                    "{at}.plugins.{field}.enabled[{j}].name: {} is not supported by this scheduler (it needs the DRA machinery, which is not built)",
                    e.name
                ));
            }
            if registry.get(&e.name).is_none() {
                return Err(format!(
                    "{at}.plugins.{field}.enabled[{j}].name: unknown plugin {:?}",
                    e.name
                ));
            }
        }
    }
    // Defaults, without the plugins not built: the guard stands in for DynamicResources
    // (registered under that name).
    let defaults: Vec<PluginRef> = DEFAULT_MULTI_POINT
        .iter()
        .filter(|(n, _)| registry.get(n).is_some())
        .map(|(n, w)| PluginRef {
            name: n.to_string(),
            weight: Some(*w),
        })
        .collect();
    let (multi, _) = merge_set(&defaults, &custom.multi_point);
    let mut per_point: BTreeMap<Point, (Vec<PluginRef>, BTreeSet<String>)> = BTreeMap::new();
    for pt in Point::ALL {
        per_point.insert(pt, merge_set(&[], custom.point(pt)));
    }

    // Plugin args by name, with where they are in the file.
    let mut args: HashMap<&str, (Option<&Value>, String)> = HashMap::new();
    for (j, pc) in p.plugin_config.iter().enumerate() {
        if registry.get(&pc.name).is_none() && !NOT_BUILT.contains(&pc.name.as_str()) {
            return Err(format!(
                "{at}.pluginConfig[{j}].name: unknown plugin {:?}",
                pc.name
            ));
        }
        let entry = (pc.args.as_ref(), format!("{at}.pluginConfig[{j}].args"));
        if args.insert(&pc.name, entry).is_some() {
            return Err(format!(
                "{at}.pluginConfig[{j}].name: duplicate config for plugin {:?}",
                pc.name
            ));
        }
    }

    // Instantiate every plugin named anywhere, once.
    let mut needed: Vec<&str> = multi.iter().map(|p| p.name.as_str()).collect();
    for (enabled, _) in per_point.values() {
        needed.extend(enabled.iter().map(|p| p.name.as_str()));
    }
    let mut built: HashMap<&str, Built> = HashMap::new();
    for name in needed {
        if built.contains_key(name) {
            continue;
        }
        let ctor = registry
            .get(name)
            .ok_or_else(|| format!("{at}.plugins: unknown plugin {name:?}"))?;
        let (a, path) = match args.get(name) {
            Some((a, path)) => (*a, path.clone()),
            // No entry: the defaults, which always validate.
            None => (None, format!("{at}.pluginConfig[{name}].args")),
        };
        let b = ctor(a, &path, ctx).map_err(|e| match e {
            BuildError::Args(e) => e,
            BuildError::Plugin(e) => format!("{at}.plugins: {name}: {e}"),
        })?;
        built.insert(name, b);
    }

    let mut fw = Framework {
        name: p
            .scheduler_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_string()),
        percentage_of_nodes_to_score: match p.percentage_of_nodes_to_score {
            None => None,
            Some(v) if (0..=100).contains(&v) => Some(v as u32),
            Some(v) => {
                return Err(format!(
                    "{at}.percentageOfNodesToScore: {v} is not in 0..=100"
                ))
            }
        },
        ..Framework::default()
    };
    let mut weights: HashMap<String, i64> = HashMap::new();
    for pt in Point::ALL {
        let (explicit, disabled) = &per_point[&pt];
        for (j, e) in explicit.iter().enumerate() {
            if !built[e.name.as_str()].implements(pt) {
                return Err(format!(
                    "{at}.plugins.{}.enabled[{j}].name: plugin {:?} does not extend {}",
                    pt.field(),
                    e.name,
                    pt.interface()
                ));
            }
            if pt == Point::Score {
                if let Some(w) = e.weight {
                    if w < 0 {
                        return Err(format!(
                            "{at}.plugins.score.enabled[{j}].weight: {w} is negative"
                        ));
                    }
                }
                weights.insert(e.name.clone(), e.weight.unwrap_or(0).max(0) as i64);
            }
        }
        let explicit_names: Vec<&str> = explicit.iter().map(|p| p.name.as_str()).collect();
        let mut order: Vec<&str> = Vec::new();
        let mut overridden = BTreeSet::new();
        let mut from_multi: Vec<&str> = Vec::new();
        if !disabled.contains("*") {
            for (j, m) in multi.iter().enumerate() {
                if !built[m.name.as_str()].implements(pt) || disabled.contains(&m.name) {
                    continue;
                }
                if explicit_names.contains(&m.name.as_str()) {
                    overridden.insert(m.name.as_str());
                    continue;
                }
                if from_multi.contains(&m.name.as_str()) {
                    return Err(format!(
                        "{at}.plugins.multiPoint.enabled[{j}].name: plugin {:?} already registered as {:?}",
                        m.name,
                        pt.interface()
                    ));
                }
                from_multi.push(m.name.as_str());
                if pt == Point::Score && !weights.contains_key(&m.name) {
                    weights.insert(m.name.clone(), m.weight.unwrap_or(0).max(0) as i64);
                }
            }
        }
        order.extend(explicit_names.iter().filter(|n| overridden.contains(*n)));
        order.extend(from_multi.iter());
        order.extend(explicit_names.iter().filter(|n| !overridden.contains(*n)));
        let mut seen = BTreeSet::new();
        for name in order {
            if !seen.insert(name) {
                return Err(format!(
                    "{at}.plugins.{}: plugin {name:?} enabled twice",
                    pt.field()
                ));
            }
            let b = &built[name];
            match pt {
                Point::PreEnqueue => fw.pre_enqueue.extend(b.pre_enqueue.clone()),
                Point::QueueSort => {
                    if fw.queue_sort.is_some() {
                        return Err(format!(
                            "{at}.plugins.queueSort: only one queue sort plugin may be enabled"
                        ));
                    }
                    fw.queue_sort = b.queue_sort.clone();
                }
                Point::PreFilter => fw.pre_filter.extend(b.pre_filter.clone()),
                Point::Filter => fw.filter.extend(b.filter.clone()),
                Point::PostFilter => fw.post_filter.extend(b.post_filter.clone()),
                Point::PreScore => fw.pre_score.extend(b.pre_score.clone()),
                Point::Score => {
                    let w = weights.get(name).copied().unwrap_or(0);
                    fw.score
                        .extend(b.score.clone().map(|s| (s, if w == 0 { 1 } else { w })));
                }
                Point::Reserve => fw.reserve.extend(b.reserve.clone()),
                Point::Permit => fw.permit.extend(b.permit.clone()),
                Point::PreBind => fw.pre_bind.extend(b.pre_bind.clone()),
                Point::Bind => fw.bind.extend(b.bind.clone()),
                Point::PostBind => fw.post_bind.extend(b.post_bind.clone()),
            }
        }
    }
    if fw.queue_sort.is_none() {
        return Err(format!(
            "{at}.plugins.queueSort: one queue sort plugin is required"
        ));
    }
    if fw.bind.is_empty() {
        return Err(format!(
            "{at}.plugins.bind: at least one bind plugin is required"
        ));
    }
    Ok(fw)
}

/// Validates the file and builds every profile.
pub fn build(
    cfg: &KubeSchedulerConfiguration,
    registry: &Registry,
    ctx: &BuildContext,
) -> Result<Config, String> {
    if !cfg.extenders.is_empty() {
        return Err("extenders: scheduler extenders are not supported".to_string());
    }
    let parallelism = match cfg.parallelism {
        None => super::framework::runtime::DEFAULT_PARALLELISM,
        Some(p) if p > 0 => p as usize,
        Some(p) => return Err(format!("parallelism: {p} must be greater than 0")),
    };
    let ctx = &BuildContext {
        workers: super::framework::runtime::workers(parallelism),
        ..ctx.clone()
    };
    let percentage = match cfg.percentage_of_nodes_to_score {
        None => 0,
        Some(p) if (0..=100).contains(&p) => p as u32,
        Some(p) => return Err(format!("percentageOfNodesToScore: {p} is not in 0..=100")),
    };
    let initial = cfg.pod_initial_backoff_seconds.unwrap_or(1);
    let max = cfg.pod_max_backoff_seconds.unwrap_or(10);
    if initial <= 0 {
        return Err(format!(
            "podInitialBackoffSeconds: {initial} must be greater than 0"
        ));
    }
    if max < initial {
        return Err(format!(
            "podMaxBackoffSeconds: {max} must be at least podInitialBackoffSeconds ({initial})"
        ));
    }
    let default_profiles = [ProfileConfig::default()];
    let profiles: &[ProfileConfig] = if cfg.profiles.is_empty() {
        &default_profiles
    } else {
        &cfg.profiles
    };
    let mut built = Vec::new();
    let mut names = BTreeSet::new();
    let mut sort_name: Option<&str> = None;
    for (i, p) in profiles.iter().enumerate() {
        let fw = build_profile(i, p, registry, ctx)?;
        if !names.insert(fw.name.clone()) {
            return Err(format!(
                "profiles[{i}].schedulerName: duplicate profile {:?}",
                fw.name
            ));
        }
        let sort = fw.queue_sort.as_ref().map(|s| s.name()).unwrap_or_default();
        match sort_name {
            None => sort_name = Some(sort),
            Some(s) if s != sort => {
                return Err(format!(
                    "profiles[{i}].plugins.queueSort: all profiles must have the same queue sort plugin ({s:?} and {sort:?})"
                ))
            }
            Some(_) => {}
        }
        built.push(Arc::new(fw));
    }
    Ok(Config {
        profiles: built,
        parallelism,
        percentage_of_nodes_to_score: percentage,
        backoff: Backoff {
            initial: Duration::from_secs(initial as u64),
            max: Duration::from_secs(max as u64),
        },
        leader_election: cfg.leader_election.clone(),
    })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
