//! kube-proxy's configuration file as `proxy run --config FILE` reads it: a `KubeProxyConfiguration`
//! of `kubeproxy.config.k8s.io/v1alpha1` (kube-proxy v1.34's fields), in YAML or JSON, such as the
//! `config.conf` key of kubeadm's `kube-proxy` ConfigMap.
//!
//! Owns: parsing the file (a malformed value is an error naming its field), kube-proxy's defaults
//! for what the file leaves empty or null, the mapping of each field onto the `proxy run` flag
//! that does the same thing, and the report of every field kpr does not implement: an error when
//! ignoring it would change where traffic goes or who may reach it, a warning when it would not
//! (tuning, logging, a field v1alpha1 does not have). A flag given on the command line keeps its
//! value (kube-proxy keeps only `--hostname-override` and ignores its other flags when given a
//! file; kpr keeps them all, so its own flags such as `--backend ebpf` combine with a cluster's
//! file). docs/ARCHITECTURE.md has the field-by-field table.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::Value;

use crate::cli::{Backend, NodePortAddress, RunArgs};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

/// The mark bit kpr's iptables and nftables rules use for "masquerade this" (kube-proxy's
/// default `masqueradeBit`, 0x4000).
pub const MASQUERADE_BIT: i32 = 14;

/// A file that cannot be used: the field (`conntrack.maxPerCore`, `<document>`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// How much a reported field matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// A given flag replaced the file's value.
    Info,
    /// kpr does not do it, and traffic is handled the same without it.
    Warning,
    /// kpr does not do it, and traffic would be handled differently: `proxy run` refuses to start.
    Error,
}

/// One field of the file kpr does not use as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub field: String,
    pub severity: Severity,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A Go duration (`metav1.Duration`: "30s", "1h0m0s", "250ms", "1.5h"); negative ones are refused
/// (kube-proxy's validation refuses them for every field read here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(GoDuration)
            .map_err(de::Error::custom)
    }
}

/// Go's `time.ParseDuration` for non-negative values: a sequence of decimal numbers (with an
/// optional fraction) each followed by a unit (ns, us, µs, ms, s, m, h); "0" alone is zero.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("{s:?} is not a duration like 30s, 1h0m0s or 250ms: {why}");
    let rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(format!("{s:?}: must not be negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut total_ns: f64 = 0.0;
    let mut rest = rest;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(bad("expected a number"));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(bad("missing unit")),
            other => return Err(bad(&format!("unknown unit {other:?}"))),
        };
        let n: f64 = num.parse().map_err(|_| bad("expected a number"))?;
        total_ns += n * scale;
        rest = tail;
    }
    if total_ns > u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

// The v1alpha1 types. Every field is an Option: Go reads `null` and an absent field as the zero
// value, and kubeadm writes every field, most of them null or zero.

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub client_connection: Option<ClientConnection>,
    /// component-base's LoggingConfiguration, kept as written (kpr logs through RUST_LOG).
    pub logging: Option<Value>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<IptablesConfig>,
    pub ipvs: Option<IpvsConfig>,
    pub nftables: Option<NftablesConfig>,
    /// Windows only: kube-proxy on Linux does not read it either.
    pub winkernel: Option<Value>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocal>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Option<ConntrackConfig>,
    pub config_sync_period: Option<GoDuration>,
    pub port_range: Option<String>,
    pub windows_run_as_service: Option<bool>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f64>,
    pub burst: Option<i32>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IptablesConfig {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    #[serde(rename = "localhostNodePorts")]
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NftablesConfig {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsConfig {
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<GoDuration>,
    pub tcp_fin_timeout: Option<GoDuration>,
    pub udp_timeout: Option<GoDuration>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackConfig {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<GoDuration>,
    pub udp_stream_timeout: Option<GoDuration>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// Parses the file (YAML or JSON) and checks its `apiVersion` and `kind`.
pub fn parse(text: &str) -> Result<KubeProxyConfiguration, ConfigError> {
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| ConfigError::new("<document>", format!("not YAML or JSON: {e}")))?;
    if !value.is_object() {
        return Err(ConfigError::new(
            "<document>",
            format!("expected a {KIND} object, found {}", kind_of(&value)),
        ));
    }
    let cfg: KubeProxyConfiguration = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::new(path, e.into_inner().to_string())
    })?;
    match cfg.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => {
            return Err(ConfigError::new(
                "apiVersion",
                format!("expected {API_VERSION}, found {other:?}"),
            ))
        }
    }
    match cfg.kind.as_deref() {
        Some(KIND) => {}
        other => {
            return Err(ConfigError::new(
                "kind",
                format!("expected {KIND}, found {other:?}"),
            ))
        }
    }
    Ok(cfg)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Whether a subtree says nothing: null, false, 0, "", "0", "0s", or lists and objects of those
/// (kubeadm writes the zero value of every field).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || s == "0" || s == "0s",
        Value::Array(a) => a.iter().all(is_zero),
        Value::Object(o) => o.values().all(is_zero),
    }
}

/// Which kube-proxy mode the file names, and so which of its sections kube-proxy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Iptables,
    Nftables,
    Ipvs,
    Kernelspace,
}

/// `args` with the file's values for every flag the command line did not give (kube-proxy's
/// defaults where the file is empty), and what the file asks that kpr does not do. The result's
/// `config` is None: the file is consumed.
pub fn apply(
    cfg: &KubeProxyConfiguration,
    args: &RunArgs,
) -> Result<(RunArgs, Vec<Finding>), ConfigError> {
    let mut a = Apply {
        args: args.clone(),
        findings: Vec::new(),
    };
    a.args.config = None;
    a.run(cfg)?;
    a.findings.sort_by(|x, y| x.field.cmp(&y.field));
    Ok((a.args, a.findings))
}

struct Apply {
    args: RunArgs,
    findings: Vec<Finding>,
}

fn str_of(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("").trim()
}

fn dur(d: Option<GoDuration>) -> Duration {
    d.map(|d| d.0).unwrap_or_default()
}

/// A zero duration is unset: kube-proxy's default takes its place.
fn dur_or(d: Option<GoDuration>, default: Duration) -> Duration {
    Some(dur(d)).filter(|d| !d.is_zero()).unwrap_or(default)
}

fn non_negative(field: &str, v: Option<i32>, default: i32) -> Result<u32, ConfigError> {
    let v = v.unwrap_or(default);
    u32::try_from(v).map_err(|_| ConfigError::new(field, format!("{v}: must not be negative")))
}

fn cidr(field: &str, s: &str) -> Result<IpNet, ConfigError> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| ConfigError::new(field, format!("{s:?} is not a CIDR like 10.244.0.0/16")))
}

/// `HOST:PORT`, or an address alone with `port` appended (kube-proxy's AppendPortIfNeeded).
fn bind_address(field: &str, s: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        ConfigError::new(
            field,
            format!("{s:?} is not an IP:port like 0.0.0.0:10256 or [::]:10256"),
        )
    })
}

impl Apply {
    fn given(&self, id: &str) -> bool {
        self.args.was_given(id)
    }

    fn report(&mut self, field: &str, severity: Severity, message: impl Into<String>) {
        self.findings.push(Finding {
            field: field.to_string(),
            severity,
            message: message.into(),
        });
    }

    /// Sets the flag `id` (a RunArgs field) to the file's `value` unless it was given, in which
    /// case a differing file value is noted.
    fn set<T: PartialEq>(
        &mut self,
        id: &str,
        field: &str,
        value: T,
        slot: fn(&mut RunArgs) -> &mut T,
    ) {
        if self.given(id) {
            if *slot(&mut self.args) != value {
                let flag = id.replace('_', "-");
                self.report(
                    field,
                    Severity::Info,
                    format!("--{flag} given on the command line replaces the file's value"),
                );
            }
        } else {
            *slot(&mut self.args) = value;
        }
    }

    fn run(&mut self, cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
        let mode = self.mode(cfg)?;
        self.client(cfg);
        self.addresses(cfg)?;
        self.sections(cfg, mode)?;
        self.local_detection(cfg)?;
        self.node_ports(cfg, mode)?;
        self.conntrack(cfg)?;
        self.unsupported(cfg)?;
        self.unknown(cfg);
        Ok(())
    }

    /// `mode` -> `--backend` ("" is kube-proxy's Linux default, iptables).
    fn mode(&mut self, cfg: &KubeProxyConfiguration) -> Result<Mode, ConfigError> {
        let (mode, backend) = match str_of(&cfg.mode) {
            "" | "iptables" => (Mode::Iptables, Some(Backend::Iptables)),
            "nftables" => (Mode::Nftables, Some(Backend::Nftables)),
            "ipvs" => (Mode::Ipvs, None),
            "kernelspace" => (Mode::Kernelspace, None),
            other => {
                return Err(ConfigError::new(
                    "mode",
                    format!("unknown proxy mode {other:?}: expected iptables, ipvs, nftables or kernelspace"),
                ))
            }
        };
        match backend {
            Some(b) => self.set("backend", "mode", b, |a| &mut a.backend),
            None if self.given("backend") => self.report(
                "mode",
                Severity::Info,
                "--backend given on the command line replaces the file's value",
            ),
            None => self.report(
                "mode",
                Severity::Error,
                format!(
                    "kpr has no {} backend: set mode to iptables or nftables, or pass --backend \
                     (userspace, iptables, nftables, ebpf)",
                    str_of(&cfg.mode)
                ),
            ),
        }
        Ok(mode)
    }

    /// `clientConnection`: the kubeconfig is used; the rest tunes kube-proxy's Go client.
    fn client(&mut self, cfg: &KubeProxyConfiguration) {
        let Some(cc) = &cfg.client_connection else {
            return;
        };
        let kubeconfig = str_of(&cc.kubeconfig);
        if !kubeconfig.is_empty() {
            self.set(
                "kubeconfig",
                "clientConnection.kubeconfig",
                Some(PathBuf::from(kubeconfig)),
                |a| &mut a.kubeconfig,
            );
        }
        if cc.qps.is_some_and(|q| q != 0.0) {
            self.report(
                "clientConnection.qps",
                Severity::Warning,
                "kpr's API client has no client-side rate limit: ignored",
            );
        }
        if cc.burst.is_some_and(|b| b != 0) {
            self.report(
                "clientConnection.burst",
                Severity::Warning,
                "kpr's API client has no client-side rate limit: ignored",
            );
        }
        // contentType and acceptContentTypes only choose the wire encoding (kpr uses JSON).
    }

    /// hostnameOverride, bindAddress, healthzBindAddress, metricsBindAddress.
    fn addresses(&mut self, cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
        let host = str_of(&cfg.hostname_override);
        if !host.is_empty() {
            // kube-proxy lower-cases the node name it is given.
            self.set(
                "hostname_override",
                "hostnameOverride",
                Some(host.to_lowercase()),
                |a| &mut a.hostname_override,
            );
        }
        let bind = str_of(&cfg.bind_address);
        let bind_ip = match bind {
            "" => None,
            s => Some(s.parse::<IpAddr>().map_err(|_| {
                ConfigError::new("bindAddress", format!("{s:?} is not an IP address"))
            })?),
        };
        if bind_ip.is_some_and(|ip| !ip.is_unspecified()) {
            self.report(
                "bindAddress",
                Severity::Warning,
                "kube-proxy takes it as the node's primary IP; kpr uses every address of the \
                 node's interfaces: ignored",
            );
        }
        // kube-proxy's defaults follow bindAddress's family.
        let v6 = bind_ip.is_some_and(|ip| ip.is_ipv6());
        let (healthz_ip, metrics_ip): (IpAddr, IpAddr) = if v6 {
            (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into())
        } else {
            (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into())
        };
        let healthz = match str_of(&cfg.healthz_bind_address) {
            "" => SocketAddr::new(healthz_ip, 10256),
            s => bind_address("healthzBindAddress", s, 10256)?,
        };
        self.set("healthz_bind_address", "healthzBindAddress", healthz, |a| {
            &mut a.healthz_bind_address
        });
        let metrics = match str_of(&cfg.metrics_bind_address) {
            "" => SocketAddr::new(metrics_ip, 10249),
            s => bind_address("metricsBindAddress", s, 10249)?,
        };
        self.set("metrics_bind_address", "metricsBindAddress", metrics, |a| {
            &mut a.metrics_bind_address
        });
        Ok(())
    }

    /// The mode's section (as kube-proxy converts v1alpha1): sync periods, masqueradeAll and
    /// masqueradeBit; iptables.localhostNodePorts.
    fn sections(&mut self, cfg: &KubeProxyConfiguration, mode: Mode) -> Result<(), ConfigError> {
        let ipt = cfg.iptables.as_ref();
        let nft = cfg.nftables.as_ref();
        let ipvs = cfg.ipvs.as_ref();
        let second = Duration::from_secs(1);
        let thirty = Duration::from_secs(30);
        let (section, sync, min_sync, masq_all, masq_bit) = match mode {
            Mode::Nftables => (
                "nftables",
                dur_or(nft.and_then(|s| s.sync_period), thirty),
                dur_or(nft.and_then(|s| s.min_sync_period), second),
                nft.and_then(|s| s.masquerade_all),
                nft.and_then(|s| s.masquerade_bit),
            ),
            Mode::Ipvs => (
                "ipvs",
                dur_or(ipvs.and_then(|s| s.sync_period), thirty),
                dur(ipvs.and_then(|s| s.min_sync_period)),
                ipt.and_then(|s| s.masquerade_all),
                ipt.and_then(|s| s.masquerade_bit),
            ),
            Mode::Iptables | Mode::Kernelspace => (
                "iptables",
                dur_or(ipt.and_then(|s| s.sync_period), thirty),
                dur_or(ipt.and_then(|s| s.min_sync_period), second),
                ipt.and_then(|s| s.masquerade_all),
                ipt.and_then(|s| s.masquerade_bit),
            ),
        };
        self.set("sync_period", &format!("{section}.syncPeriod"), sync, |a| {
            &mut a.sync_period
        });
        self.set(
            "min_sync_period",
            &format!("{section}.minSyncPeriod"),
            min_sync,
            |a| &mut a.min_sync_period,
        );
        // ipvs mode reads iptables.masqueradeAll and masqueradeBit.
        let masq_section = if mode == Mode::Nftables {
            "nftables"
        } else {
            "iptables"
        };
        self.set(
            "masquerade_all",
            &format!("{masq_section}.masqueradeAll"),
            masq_all.unwrap_or(false),
            |a| &mut a.masquerade_all,
        );
        let bit = masq_bit.unwrap_or(MASQUERADE_BIT);
        let field = format!("{masq_section}.masqueradeBit");
        if !(0..=31).contains(&bit) {
            return Err(ConfigError::new(
                field,
                format!("{bit}: must be within [0, 31]"),
            ));
        }
        if bit != MASQUERADE_BIT {
            // Only the rule backends mark packets; a mark bit another component relies on
            // would be overwritten.
            let marks = matches!(self.args.backend, Backend::Iptables | Backend::Nftables);
            self.report(
                &field,
                if marks { Severity::Error } else { Severity::Warning },
                format!("kpr's rules mark packets to masquerade with bit {MASQUERADE_BIT} (0x4000) only"),
            );
        }
        if mode == Mode::Iptables && ipt.and_then(|s| s.localhost_node_ports) != Some(false) {
            self.report(
                "iptables.localhostNodePorts",
                Severity::Warning,
                "kube-proxy's iptables mode accepts NodePort connections to 127.0.0.1 when this \
                 is true or unset; kpr never does (set it to false to say so)",
            );
        }
        Ok(())
    }

    /// clusterCIDR -> --cluster-cidr; detectLocalMode (only ClusterCIDR).
    fn local_detection(&mut self, cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
        let list = str_of(&cfg.cluster_cidr);
        if !list.is_empty() {
            let cidrs = list
                .split(',')
                .map(|s| cidr("clusterCIDR", s.trim()))
                .collect::<Result<Vec<_>, _>>()?;
            self.set("cluster_cidr", "clusterCIDR", cidrs, |a| {
                &mut a.cluster_cidr
            });
        }
        match str_of(&cfg.detect_local_mode) {
            "" | "ClusterCIDR" => {}
            m @ ("NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix") => self.report(
                "detectLocalMode",
                Severity::Error,
                format!(
                    "{m}: kpr tells pod traffic by clusterCIDR (--cluster-cidr) only; set \
                     detectLocalMode to ClusterCIDR"
                ),
            ),
            other => {
                return Err(ConfigError::new(
                    "detectLocalMode",
                    format!(
                        "unknown mode {other:?}: expected ClusterCIDR, NodeCIDR, \
                         BridgeInterface or InterfaceNamePrefix"
                    ),
                ))
            }
        }
        Ok(())
    }

    /// nodePortAddresses -> --nodeport-addresses ("all" is kpr's default, every node address;
    /// "primary", and an unset list in nftables mode as kube-proxy has it, the Node's primary
    /// addresses).
    fn node_ports(&mut self, cfg: &KubeProxyConfiguration, mode: Mode) -> Result<(), ConfigError> {
        let list = cfg.node_port_addresses.clone().unwrap_or_default();
        let mut addrs = Vec::new();
        let mut all = false;
        for (i, entry) in list.iter().enumerate() {
            let field = format!("nodePortAddresses[{i}]");
            match entry.trim() {
                "all" => all = true,
                "primary" => addrs.push(NodePortAddress::Primary),
                "localhost" => {
                    if !self.given("nodeport_addresses") {
                        self.report(
                            &field,
                            Severity::Error,
                            "\"localhost\": kpr never accepts NodePort connections on loopback \
                             addresses",
                        );
                    }
                }
                s => addrs.push(NodePortAddress::Cidr(cidr(&field, s)?)),
            }
        }
        if all {
            addrs.clear();
        }
        // kube-proxy's nftables mode defaults an unset list to the Node's primary addresses.
        if list.is_empty() && mode == Mode::Nftables {
            addrs.push(NodePortAddress::Primary);
        }
        self.set("nodeport_addresses", "nodePortAddresses", addrs, |a| {
            &mut a.nodeport_addresses
        });
        Ok(())
    }

    /// The conntrack section -> the --conntrack-* flags (kube-proxy's defaults for null fields).
    fn conntrack(&mut self, cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
        let empty = ConntrackConfig::default();
        let ct = cfg.conntrack.as_ref().unwrap_or(&empty);
        let per_core = non_negative("conntrack.maxPerCore", ct.max_per_core, 32 * 1024)?;
        let min = non_negative("conntrack.min", ct.min, 128 * 1024)?;
        self.set(
            "conntrack_max_per_core",
            "conntrack.maxPerCore",
            per_core,
            |a| &mut a.conntrack_max_per_core,
        );
        self.set("conntrack_min", "conntrack.min", min, |a| {
            &mut a.conntrack_min
        });
        // tcpEstablishedTimeout and tcpCloseWaitTimeout are pointers in v1alpha1: null takes the
        // default, an explicit 0 leaves the sysctl alone. The UDP ones are plain (0 = leave).
        let established = ct
            .tcp_established_timeout
            .map_or(Duration::from_secs(24 * 3600), |d| d.0);
        let close_wait = ct
            .tcp_close_wait_timeout
            .map_or(Duration::from_secs(3600), |d| d.0);
        let timeouts = [
            ("conntrack.tcpEstablishedTimeout", established),
            ("conntrack.tcpCloseWaitTimeout", close_wait),
            ("conntrack.udpTimeout", dur(ct.udp_timeout)),
            ("conntrack.udpStreamTimeout", dur(ct.udp_stream_timeout)),
        ];
        for (field, d) in timeouts {
            check_whole_seconds(field, d)?;
        }
        self.set(
            "conntrack_tcp_timeout_established",
            "conntrack.tcpEstablishedTimeout",
            established,
            |a| &mut a.conntrack_tcp_timeout_established,
        );
        self.set(
            "conntrack_tcp_timeout_close_wait",
            "conntrack.tcpCloseWaitTimeout",
            close_wait,
            |a| &mut a.conntrack_tcp_timeout_close_wait,
        );
        self.set(
            "conntrack_tcp_be_liberal",
            "conntrack.tcpBeLiberal",
            ct.tcp_be_liberal.unwrap_or(false),
            |a| &mut a.conntrack_tcp_be_liberal,
        );
        self.set(
            "conntrack_udp_timeout",
            "conntrack.udpTimeout",
            dur(ct.udp_timeout),
            |a| &mut a.conntrack_udp_timeout,
        );
        self.set(
            "conntrack_udp_timeout_stream",
            "conntrack.udpStreamTimeout",
            dur(ct.udp_stream_timeout),
            |a| &mut a.conntrack_udp_timeout_stream,
        );
        Ok(())
    }

    /// Fields kpr has no equivalent for.
    fn unsupported(&mut self, cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
        for (gate, on) in cfg.feature_gates.iter().flatten() {
            self.report(
                &format!("featureGates.{gate}"),
                Severity::Warning,
                format!("{on}: kpr has no feature gates: ignored"),
            );
        }
        if cfg.logging.as_ref().is_some_and(|l| !is_zero(l)) {
            self.report(
                "logging",
                Severity::Warning,
                "kpr's log level comes from RUST_LOG (error, warn, info, debug, trace): ignored",
            );
        }
        if cfg.enable_profiling == Some(true) {
            self.report(
                "enableProfiling",
                Severity::Warning,
                "kpr serves no /debug/pprof: ignored",
            );
        }
        if !str_of(&cfg.show_hidden_metrics_for_version).is_empty() {
            self.report(
                "showHiddenMetricsForVersion",
                Severity::Warning,
                "kpr has no hidden metrics: ignored",
            );
        }
        if let Some(adj) = cfg.oom_score_adj {
            if !(-1000..=1000).contains(&adj) {
                return Err(ConfigError::new(
                    "oomScoreAdj",
                    format!("{adj}: must be within [-1000, 1000]"),
                ));
            }
            self.report(
                "oomScoreAdj",
                Severity::Warning,
                "kpr leaves its OOM score to the kubelet (the Pod's priority class): ignored",
            );
        }
        if !dur(cfg.config_sync_period).is_zero() {
            self.report(
                "configSyncPeriod",
                Severity::Warning,
                "kpr's watches have no periodic resync: ignored",
            );
        }
        if !str_of(&cfg.port_range).is_empty() {
            self.report(
                "portRange",
                Severity::Warning,
                "unused (kube-proxy ignores it too)",
            );
        }
        self.set(
            "bind_address_hard_fail",
            "bindAddressHardFail",
            cfg.bind_address_hard_fail.unwrap_or(false),
            |a| &mut a.bind_address_hard_fail,
        );
        // detectLocal,
        // ipvs (with another mode) and winkernel are not read by kube-proxy either in those
        // configurations; contentType only picks the wire encoding.
        Ok(())
    }

    /// Fields v1alpha1 does not have (kube-proxy's lenient decoding logs and ignores them too).
    fn unknown(&mut self, cfg: &KubeProxyConfiguration) {
        let mut names: Vec<String> = cfg.unknown.keys().cloned().collect();
        let nested = [
            (
                "clientConnection",
                cfg.client_connection.as_ref().map(|s| &s.unknown),
            ),
            ("iptables", cfg.iptables.as_ref().map(|s| &s.unknown)),
            ("nftables", cfg.nftables.as_ref().map(|s| &s.unknown)),
            ("ipvs", cfg.ipvs.as_ref().map(|s| &s.unknown)),
            ("detectLocal", cfg.detect_local.as_ref().map(|s| &s.unknown)),
            ("conntrack", cfg.conntrack.as_ref().map(|s| &s.unknown)),
        ];
        for (section, unknown) in nested {
            names.extend(
                unknown
                    .into_iter()
                    .flat_map(|u| u.keys().map(move |k| format!("{section}.{k}"))),
            );
        }
        for name in names {
            self.report(
                &name,
                Severity::Warning,
                format!("not a field of {API_VERSION} (kube-proxy v1.34): ignored"),
            );
        }
    }
}

/// kube-proxy writes conntrack timeouts in whole seconds; a positive value under a second would
/// truncate to 0.
pub fn check_whole_seconds(field: &str, d: Duration) -> Result<(), ConfigError> {
    if !d.is_zero() && d < Duration::from_secs(1) {
        return Err(ConfigError::new(
            field,
            format!("{d:?}: must be 0 (leave the sysctl as it is) or at least 1s"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
