//! Plugin name -> constructor, and kube-scheduler v1.34's default plugin set with its weights
//! (the `multiPoint` list `kube-scheduler --write-config-to` prints), as upstream's in-tree
//! registry and `getDefaultPlugins`.
//!
//! A constructor returns a [`Built`]: the one plugin instance seen through every extension-point
//! trait it implements. Which traits each plugin implements is written here by hand (Rust has no
//! run-time interface check); [`Built::implements`] answers the config's "does this plugin
//! extend Filter" questions from it.
//!
//! Not built (needs the DRA machinery): DynamicResources. In the default set it is replaced by
//! [`UnsupportedGuard`] (Pods with resource claims are unresolvable, with a message saying so);
//! naming it in a profile is a config error.
//!
//! A plugin with args is registered with its typed args ([`Registry::register_with_args`]):
//! the registry decodes, defaults and validates them ([`plugin_args`]) before the plugin's
//! constructor sees them, so a new plugin with args adds one [`PluginArgs`] type and one row.
//!
//! Owns construction only; no API calls except the DefaultBinder's client, passed in.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::framework::{
    BindPlugin, ClusterObjects, FilterPlugin, PermitPlugin, Plugin, PostBindPlugin,
    PostFilterPlugin, PreBindPlugin, PreEnqueuePlugin, PreFilterPlugin, PreScorePlugin,
    QueueSortPlugin, ReservePlugin, ScorePlugin, StaticObjects,
};
use super::plugin_args::{self, PluginArgs, VolumeBindingArgs};
use super::plugins;
use super::plugins::unsupported_resource_claims::UnsupportedGuard;

/// The extension points, with their KubeSchedulerConfiguration field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    PreEnqueue,
    QueueSort,
    PreFilter,
    Filter,
    PostFilter,
    PreScore,
    Score,
    Reserve,
    Permit,
    PreBind,
    Bind,
    PostBind,
}

impl Point {
    pub const ALL: [Point; 12] = [
        Point::PreEnqueue,
        Point::QueueSort,
        Point::PreFilter,
        Point::Filter,
        Point::PostFilter,
        Point::PreScore,
        Point::Score,
        Point::Reserve,
        Point::Permit,
        Point::PreBind,
        Point::Bind,
        Point::PostBind,
    ];

    /// The field in `profiles[].plugins`.
    pub fn field(self) -> &'static str {
        match self {
            Point::PreEnqueue => "preEnqueue",
            Point::QueueSort => "queueSort",
            Point::PreFilter => "preFilter",
            Point::Filter => "filter",
            Point::PostFilter => "postFilter",
            Point::PreScore => "preScore",
            Point::Score => "score",
            Point::Reserve => "reserve",
            Point::Permit => "permit",
            Point::PreBind => "preBind",
            Point::Bind => "bind",
            Point::PostBind => "postBind",
        }
    }

    /// Upstream's interface name (in error messages).
    pub fn interface(self) -> &'static str {
        match self {
            Point::PreEnqueue => "PreEnqueuePlugin",
            Point::QueueSort => "QueueSortPlugin",
            Point::PreFilter => "PreFilterPlugin",
            Point::Filter => "FilterPlugin",
            Point::PostFilter => "PostFilterPlugin",
            Point::PreScore => "PreScorePlugin",
            Point::Score => "ScorePlugin",
            Point::Reserve => "ReservePlugin",
            Point::Permit => "PermitPlugin",
            Point::PreBind => "PreBindPlugin",
            Point::Bind => "BindPlugin",
            Point::PostBind => "PostBindPlugin",
        }
    }
}

/// One plugin instance, through each extension-point trait it implements.
#[derive(Clone, Default)]
pub struct Built {
    pub name: &'static str,
    pub pre_enqueue: Option<Arc<dyn PreEnqueuePlugin>>,
    pub queue_sort: Option<Arc<dyn QueueSortPlugin>>,
    pub pre_filter: Option<Arc<dyn PreFilterPlugin>>,
    pub filter: Option<Arc<dyn FilterPlugin>>,
    pub post_filter: Option<Arc<dyn PostFilterPlugin>>,
    pub pre_score: Option<Arc<dyn PreScorePlugin>>,
    pub score: Option<Arc<dyn ScorePlugin>>,
    pub reserve: Option<Arc<dyn ReservePlugin>>,
    pub permit: Option<Arc<dyn PermitPlugin>>,
    pub pre_bind: Option<Arc<dyn PreBindPlugin>>,
    pub bind: Option<Arc<dyn BindPlugin>>,
    pub post_bind: Option<Arc<dyn PostBindPlugin>>,
}

impl Built {
    pub fn new(name: &'static str) -> Built {
        Built {
            name,
            ..Built::default()
        }
    }
    pub fn pre_enqueue(mut self, p: Arc<dyn PreEnqueuePlugin>) -> Self {
        self.pre_enqueue = Some(p);
        self
    }
    pub fn queue_sort(mut self, p: Arc<dyn QueueSortPlugin>) -> Self {
        self.queue_sort = Some(p);
        self
    }
    pub fn pre_filter(mut self, p: Arc<dyn PreFilterPlugin>) -> Self {
        self.pre_filter = Some(p);
        self
    }
    pub fn filter(mut self, p: Arc<dyn FilterPlugin>) -> Self {
        self.filter = Some(p);
        self
    }
    pub fn post_filter(mut self, p: Arc<dyn PostFilterPlugin>) -> Self {
        self.post_filter = Some(p);
        self
    }
    pub fn pre_score(mut self, p: Arc<dyn PreScorePlugin>) -> Self {
        self.pre_score = Some(p);
        self
    }
    pub fn score(mut self, p: Arc<dyn ScorePlugin>) -> Self {
        self.score = Some(p);
        self
    }
    pub fn reserve(mut self, p: Arc<dyn ReservePlugin>) -> Self {
        self.reserve = Some(p);
        self
    }
    pub fn permit(mut self, p: Arc<dyn PermitPlugin>) -> Self {
        self.permit = Some(p);
        self
    }
    pub fn pre_bind(mut self, p: Arc<dyn PreBindPlugin>) -> Self {
        self.pre_bind = Some(p);
        self
    }
    pub fn bind(mut self, p: Arc<dyn BindPlugin>) -> Self {
        self.bind = Some(p);
        self
    }
    pub fn post_bind(mut self, p: Arc<dyn PostBindPlugin>) -> Self {
        self.post_bind = Some(p);
        self
    }

    /// Whether the plugin extends `point`.
    pub fn implements(&self, point: Point) -> bool {
        match point {
            Point::PreEnqueue => self.pre_enqueue.is_some(),
            Point::QueueSort => self.queue_sort.is_some(),
            Point::PreFilter => self.pre_filter.is_some(),
            Point::Filter => self.filter.is_some(),
            Point::PostFilter => self.post_filter.is_some(),
            Point::PreScore => self.pre_score.is_some(),
            Point::Score => self.score.is_some(),
            Point::Reserve => self.reserve.is_some(),
            Point::Permit => self.permit.is_some(),
            Point::PreBind => self.pre_bind.is_some(),
            Point::Bind => self.bind.is_some(),
            Point::PostBind => self.post_bind.is_some(),
        }
    }
}

/// What constructors may need besides their args.
#[derive(Clone)]
pub struct BuildContext {
    /// Services, owners, PDBs (PodTopologySpread's system defaults, DefaultPreemption).
    pub objects: Arc<dyn ClusterObjects>,
    /// The API client (DefaultBinder). None in tests that bind with a plugin of their own.
    pub client: Option<kube::Client>,
    /// Threads a plugin's own pass over every node may use (the configuration's `parallelism`
    /// at most the cores; set by [`config::build`](super::config::build)).
    pub workers: usize,
}

impl Default for BuildContext {
    fn default() -> Self {
        BuildContext {
            objects: Arc::new(StaticObjects::default()),
            client: None,
            workers: super::framework::runtime::workers(
                super::framework::runtime::DEFAULT_PARALLELISM,
            ),
        }
    }
}

/// A plugin constructor: the `pluginConfig` entry's `args` (None: no entry), where they are in
/// the file (for errors naming the field), and the context.
pub type Constructor =
    Arc<dyn Fn(Option<&Value>, &str, &BuildContext) -> Result<Built, BuildError> + Send + Sync>;

/// Why a plugin was not built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// Its args do not decode or validate; each error names its field from the file's root.
    Args(String),
    /// Anything else (DefaultBinder without an API client).
    Plugin(String),
}

/// Plugin names to constructors.
#[derive(Clone, Default)]
pub struct Registry {
    map: BTreeMap<&'static str, Constructor>,
}

/// Sets each listed extension point of a [`Built`] to one shared instance.
macro_rules! built {
    ($plugin:expr, [$($point:ident),* $(,)?]) => {{
        let p = Arc::new($plugin);
        let b = Built::new(p.name());
        $(let b = b.$point(p.clone());)*
        Ok(b)
    }};
}

/// kube-scheduler v1.34's default `multiPoint` list with weights (0: none given, counts as 1
/// for Score plugins).
pub const DEFAULT_MULTI_POINT: [(&str, i32); 19] = [
    ("SchedulingGates", 0),
    ("PrioritySort", 0),
    ("NodeUnschedulable", 0),
    ("NodeName", 0),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", 0),
    ("NodeVolumeLimits", 0),
    ("VolumeBinding", 0),
    ("VolumeZone", 0),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DynamicResources", 0),
    ("DefaultPreemption", 0),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("DefaultBinder", 0),
];

impl Registry {
    /// An empty registry (tests register their own plugins).
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds or replaces a plugin that takes no args. Args given for it in `pluginConfig` are
    /// ignored, as upstream decodes args only for the kinds it has (and its plugins ignore them).
    pub fn register(
        &mut self,
        name: &'static str,
        ctor: impl Fn(&BuildContext) -> Result<Built, String> + Send + Sync + 'static,
    ) {
        self.map.insert(
            name,
            Arc::new(move |_, _, ctx| ctor(ctx).map_err(BuildError::Plugin)),
        );
    }

    /// Adds or replaces a plugin with typed args: they are decoded, defaulted and validated
    /// ([`plugin_args::decode`]) before `ctor` sees them.
    pub fn register_with_args<A: PluginArgs + 'static>(
        &mut self,
        name: &'static str,
        ctor: impl Fn(A, &BuildContext) -> Result<Built, String> + Send + Sync + 'static,
    ) {
        self.map.insert(
            name,
            Arc::new(move |args, path, ctx| {
                let args = plugin_args::decode::<A>(args, path).map_err(BuildError::Args)?;
                ctor(args, ctx).map_err(BuildError::Plugin)
            }),
        );
    }

    pub fn get(&self, name: &str) -> Option<&Constructor> {
        self.map.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.map.keys().copied()
    }

    /// Every plugin this scheduler builds.
    pub fn builtin() -> Registry {
        let mut r = Registry::new();
        r.register(plugins::priority_sort::NAME, |_| {
            built!(plugins::priority_sort::PrioritySort::new(), [queue_sort])
        });
        r.register(plugins::scheduling_gates::NAME, |_| {
            built!(
                plugins::scheduling_gates::SchedulingGates::new(),
                [pre_enqueue]
            )
        });
        r.register(plugins::default_binder::NAME, |ctx| {
            let client = ctx
                .client
                .clone()
                .ok_or("DefaultBinder needs an API client")?;
            built!(plugins::default_binder::DefaultBinder::new(client), [bind])
        });
        r.register_with_args(
            plugins::volume_binding::NAME,
            |args: VolumeBindingArgs, ctx| {
                built!(
                    plugins::volume_binding::VolumeBinding::new(
                        &args,
                        ctx.objects.clone(),
                        ctx.client.clone()
                    ),
                    [pre_filter, filter, pre_score, score, reserve, pre_bind]
                )
            },
        );
        r.register(plugins::volume_zone::NAME, |ctx| {
            built!(
                plugins::volume_zone::VolumeZone::new(ctx.objects.clone()),
                [pre_filter, filter]
            )
        });
        r.register(plugins::node_volume_limits::NAME, |ctx| {
            built!(
                plugins::node_volume_limits::NodeVolumeLimits::new(ctx.objects.clone()),
                [pre_filter, filter]
            )
        });
        r.register("DynamicResources", |_| {
            built!(UnsupportedGuard::new(), [pre_filter, post_filter])
        });
        r.register(plugins::node_unschedulable::NAME, |_| {
            built!(
                plugins::node_unschedulable::NodeUnschedulable::new(),
                [filter]
            )
        });
        r.register(plugins::node_name::NAME, |_| {
            built!(plugins::node_name::NodeName::new(), [filter])
        });
        r.register(plugins::taint_toleration::NAME, |_| {
            built!(
                plugins::taint_toleration::TaintToleration::new(),
                [filter, pre_score, score]
            )
        });
        r.register_with_args(plugins::node_affinity::NAME, |args, _| {
            built!(
                plugins::node_affinity::NodeAffinity::new(&args)?,
                [pre_filter, filter, pre_score, score]
            )
        });
        r.register(plugins::node_ports::NAME, |_| {
            built!(plugins::node_ports::NodePorts::new(), [pre_filter, filter])
        });
        r.register_with_args(plugins::pod_topology_spread::NAME, |args, ctx| {
            built!(
                plugins::pod_topology_spread::PodTopologySpread::new(args, ctx.objects.clone()),
                [pre_filter, filter, pre_score, score]
            )
        });
        r.register_with_args(plugins::default_preemption::NAME, |args, ctx| {
            built!(
                plugins::default_preemption::DefaultPreemption::new(args, ctx.objects.clone()),
                [post_filter]
            )
        });
        r.register_with_args(plugins::node_resources_fit::NAME, |args, _| {
            built!(
                plugins::node_resources_fit::NodeResourcesFit::new(&args),
                [pre_filter, filter, pre_score, score]
            )
        });
        r.register_with_args(plugins::balanced_allocation::NAME, |args, _| {
            built!(
                plugins::balanced_allocation::BalancedAllocation::new(&args),
                [pre_score, score]
            )
        });
        r.register(plugins::image_locality::NAME, |_| {
            built!(
                plugins::image_locality::ImageLocality::new(),
                [pre_score, score]
            )
        });
        r.register(plugins::volume_restrictions::NAME, |ctx| {
            built!(
                plugins::volume_restrictions::VolumeRestrictions::new(ctx.objects.clone()),
                [pre_filter, filter]
            )
        });
        r.register_with_args(plugins::inter_pod_affinity::NAME, |args, ctx| {
            built!(
                plugins::inter_pod_affinity::InterPodAffinity::new(args, ctx.workers),
                [pre_filter, filter, pre_score, score]
            )
        });
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_plugin_is_built_or_refused_by_name() {
        let r = Registry::builtin();
        let not_built = plugins::unsupported_resource_claims::NOT_BUILT;
        for (name, _) in DEFAULT_MULTI_POINT {
            assert!(
                r.get(name).is_some() || not_built.contains(&name),
                "{name} is neither registered nor listed as not built"
            );
        }
    }

    #[test]
    fn default_profile_has_v1_34_order_and_weights() {
        struct Binder;
        impl Plugin for Binder {
            fn name(&self) -> &'static str {
                "DefaultBinder"
            }
        }
        impl BindPlugin for Binder {
            fn bind<'a>(
                &'a self,
                _: &'a super::super::framework::CycleState,
                _: &'a k8s_openapi::api::core::v1::Pod,
                _: &'a str,
            ) -> super::super::framework::BoxFuture<'a, super::super::framework::Status>
            {
                Box::pin(async { super::super::framework::Status::success() })
            }
        }
        let mut r = Registry::builtin();
        // No API client in a unit test: a binder of the same name.
        r.register("DefaultBinder", |_| {
            Ok(Built::new("DefaultBinder").bind(Arc::new(Binder)))
        });
        let fw = super::super::config::build_profile(
            0,
            &Default::default(),
            &r,
            &BuildContext::default(),
        )
        .unwrap();
        let names = |v: Vec<&str>| v.join(",");
        assert_eq!(
            names(fw.pre_enqueue.iter().map(|p| p.name()).collect()),
            "SchedulingGates"
        );
        assert_eq!(
            fw.queue_sort.as_ref().map(|p| p.name()),
            Some("PrioritySort")
        );
        assert_eq!(
            names(fw.pre_filter.iter().map(|p| p.name()).collect()),
            "NodeAffinity,NodePorts,NodeResourcesFit,VolumeRestrictions,NodeVolumeLimits,VolumeBinding,VolumeZone,PodTopologySpread,InterPodAffinity,DynamicResources"
        );
        assert_eq!(
            names(fw.filter.iter().map(|p| p.name()).collect()),
            "NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts,NodeResourcesFit,VolumeRestrictions,NodeVolumeLimits,VolumeBinding,VolumeZone,PodTopologySpread,InterPodAffinity"
        );
        assert_eq!(
            names(fw.post_filter.iter().map(|p| p.name()).collect()),
            "DynamicResources,DefaultPreemption"
        );
        assert_eq!(
            names(fw.pre_score.iter().map(|p| p.name()).collect()),
            "TaintToleration,NodeAffinity,NodeResourcesFit,VolumeBinding,PodTopologySpread,InterPodAffinity,NodeResourcesBalancedAllocation,ImageLocality"
        );
        let scores: Vec<String> = fw
            .score
            .iter()
            .map(|(p, w)| format!("{}={w}", p.name()))
            .collect();
        assert_eq!(
            scores.join(","),
            "TaintToleration=3,NodeAffinity=2,NodeResourcesFit=1,VolumeBinding=1,PodTopologySpread=2,InterPodAffinity=2,NodeResourcesBalancedAllocation=1,ImageLocality=1"
        );
        assert_eq!(
            names(fw.bind.iter().map(|p| p.name()).collect()),
            "DefaultBinder"
        );
    }
}
