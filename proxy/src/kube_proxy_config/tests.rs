use super::*;
use crate::cli::{parse_from, Command};

/// The `config.conf` of the `kube-proxy` ConfigMap `kubeadm init` v1.34 writes (pod subnet
/// 10.244.0.0/16): every v1alpha1 field, most of them zero or null, left for kube-proxy to default.
pub const KUBEADM_CONFIG_CONF: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

fn run_args(argv: &[&str]) -> RunArgs {
    let cli = parse_from(["proxy", "run"].into_iter().chain(argv.iter().copied())).unwrap();
    match cli.command {
        Command::Run(a) => *a,
        other => panic!("{other:?}"),
    }
}

fn resolve(text: &str, argv: &[&str]) -> (RunArgs, Vec<Finding>) {
    apply(&parse(text).unwrap(), &run_args(argv)).unwrap()
}

/// KUBEADM_CONFIG_CONF with top-level fields replaced: each named key's line and its indented
/// lines are dropped, and the replacement text (YAML, possibly several lines) appended.
fn kubeadm_with(changes: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut dropping = false;
    for line in KUBEADM_CONFIG_CONF.lines() {
        if !line.starts_with(' ') {
            let key = line.split(':').next().unwrap_or_default();
            dropping = changes.iter().any(|(k, _)| *k == key);
        }
        if !dropping {
            out.push_str(line);
            out.push('\n');
        }
    }
    for (_, replacement) in changes {
        out.push_str(replacement);
        out.push('\n');
    }
    out
}

fn fields(findings: &[Finding], severity: Severity) -> Vec<&str> {
    findings
        .iter()
        .filter(|f| f.severity == severity)
        .map(|f| f.field.as_str())
        .collect()
}

#[test]
fn kubeadms_file_gets_kube_proxys_defaults() {
    let (a, findings) = resolve(KUBEADM_CONFIG_CONF, &[]);
    assert_eq!(
        a.backend,
        Backend::Iptables,
        "mode \"\" is iptables on Linux"
    );
    assert_eq!(
        a.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(a.cluster_cidr, ["10.244.0.0/16".parse::<IpNet>().unwrap()]);
    assert_eq!(a.hostname_override, None);
    assert_eq!(a.sync_period, Duration::from_secs(30));
    assert_eq!(a.min_sync_period, Duration::from_secs(1));
    assert_eq!(a.healthz_bind_address, "0.0.0.0:10256".parse().unwrap());
    assert_eq!(a.metrics_bind_address, "127.0.0.1:10249".parse().unwrap());
    assert!(a.nodeport_addresses.is_empty());
    assert!(!a.masquerade_all);
    assert_eq!((a.conntrack_max_per_core, a.conntrack_min), (32768, 131072));
    assert_eq!(
        a.conntrack_tcp_timeout_established,
        Duration::from_secs(86400)
    );
    assert_eq!(
        a.conntrack_tcp_timeout_close_wait,
        Duration::from_secs(3600)
    );
    assert_eq!(a.conntrack_udp_timeout, Duration::ZERO);
    assert_eq!(a.conntrack_udp_timeout_stream, Duration::ZERO);
    assert!(!a.conntrack_tcp_be_liberal);
    assert_eq!(a.config, None, "consumed");
    // Nothing but the one iptables-mode default kpr does not reproduce.
    assert_eq!(
        findings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "iptables.localhostNodePorts: kube-proxy's iptables mode accepts NodePort connections \
          to 127.0.0.1 when this is true or unset; kpr never does (set it to false to say so)"
        ]
    );
}

#[test]
fn kinds_patches_and_the_nftables_section() {
    let text = kubeadm_with(&[
        ("mode", "mode: nftables"),
        (
            "nftables",
            "nftables:\n  masqueradeAll: true\n  minSyncPeriod: 250ms\n  syncPeriod: 1m0s",
        ),
        (
            "conntrack",
            "conntrack:\n  maxPerCore: 0\n  tcpCloseWaitTimeout: 0s\n  udpTimeout: 30s\n  \
             udpStreamTimeout: 2m0s\n  tcpBeLiberal: true",
        ),
        (
            "nodePortAddresses",
            "nodePortAddresses: [172.18.0.3/32, \"fd00::/64\"]",
        ),
        ("hostnameOverride", "hostnameOverride: Kpr-Worker"),
        ("metricsBindAddress", "metricsBindAddress: 0.0.0.0"),
        ("healthzBindAddress", "healthzBindAddress: \"[::]:9999\""),
    ]);
    let (a, findings) = resolve(&text, &[]);
    assert_eq!(a.backend, Backend::Nftables);
    assert_eq!(a.sync_period, Duration::from_secs(60));
    assert_eq!(a.min_sync_period, Duration::from_millis(250));
    assert!(
        a.masquerade_all,
        "nftables mode reads nftables.masqueradeAll"
    );
    assert_eq!(a.conntrack_max_per_core, 0);
    assert_eq!(a.conntrack_min, 131072);
    assert_eq!(
        a.conntrack_tcp_timeout_established,
        Duration::from_secs(86400)
    );
    assert_eq!(
        a.conntrack_tcp_timeout_close_wait,
        Duration::ZERO,
        "0 leaves it"
    );
    assert_eq!(a.conntrack_udp_timeout, Duration::from_secs(30));
    assert_eq!(a.conntrack_udp_timeout_stream, Duration::from_secs(120));
    assert!(a.conntrack_tcp_be_liberal);
    assert_eq!(
        a.nodeport_addresses,
        [
            NodePortAddress::Cidr("172.18.0.3/32".parse().unwrap()),
            NodePortAddress::Cidr("fd00::/64".parse().unwrap())
        ]
    );
    assert_eq!(a.hostname_override.as_deref(), Some("kpr-worker"));
    assert_eq!(a.metrics_bind_address, "0.0.0.0:10249".parse().unwrap());
    assert_eq!(a.healthz_bind_address, "[::]:9999".parse().unwrap());
    assert!(findings.is_empty(), "{findings:?}");
}

#[test]
fn given_flags_win_and_are_noted() {
    let text = kubeadm_with(&[
        ("mode", "mode: ipvs"),
        ("hostnameOverride", "hostnameOverride: from-file"),
        ("nodePortAddresses", "nodePortAddresses: [primary]"),
    ]);
    let (a, findings) = resolve(
        &text,
        &[
            "--config",
            "/etc/kube-proxy/config.conf",
            "--backend",
            "ebpf",
            "--hostname-override",
            "from-flag",
            "--nodeport-addresses",
            "192.0.2.0/24",
            "--conntrack-min",
            "7",
        ],
    );
    assert_eq!(a.backend, Backend::Ebpf);
    assert_eq!(a.hostname_override.as_deref(), Some("from-flag"));
    assert_eq!(
        a.nodeport_addresses,
        [NodePortAddress::Cidr("192.0.2.0/24".parse().unwrap())]
    );
    assert_eq!(a.conntrack_min, 7);
    assert_eq!(
        a.min_sync_period,
        Duration::ZERO,
        "ipvs's default minSyncPeriod"
    );
    assert!(
        fields(&findings, Severity::Error).is_empty(),
        "{findings:?}"
    );
    assert_eq!(
        fields(&findings, Severity::Info),
        [
            "conntrack.min",
            "hostnameOverride",
            "mode",
            "nodePortAddresses"
        ]
    );
    assert!(
        findings[0].message.contains("--conntrack-min given"),
        "{findings:?}"
    );
}

#[test]
fn what_kpr_does_not_do_is_named_with_its_weight() {
    let text = kubeadm_with(&[
        ("mode", "mode: ipvs"),
        ("detectLocalMode", "detectLocalMode: NodeCIDR"),
        (
            "nodePortAddresses",
            "nodePortAddresses: [10.0.0.0/8, localhost]",
        ),
        ("oomScoreAdj", "oomScoreAdj: -999"),
        ("enableProfiling", "enableProfiling: true"),
        ("configSyncPeriod", "configSyncPeriod: 15m0s"),
        ("bindAddress", "bindAddress: 192.0.2.7"),
        (
            "featureGates",
            "featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true",
        ),
        ("logging", "logging:\n  verbosity: 4"),
    ]);
    let (_, findings) = resolve(&text, &[]);
    assert_eq!(
        fields(&findings, Severity::Error),
        ["detectLocalMode", "mode", "nodePortAddresses[1]"]
    );
    assert_eq!(
        fields(&findings, Severity::Warning),
        [
            "bindAddress",
            "configSyncPeriod",
            "enableProfiling",
            "featureGates.KubeProxyNFTablesLocalhostNodePorts",
            "logging",
            "oomScoreAdj",
        ]
    );
    let mode = findings.iter().find(|f| f.field == "mode").unwrap();
    assert!(mode.message.contains("kpr has no ipvs backend"), "{mode}");
}

#[test]
fn a_masquerade_bit_other_than_14_is_an_error_for_the_rule_backends_only() {
    let text = kubeadm_with(&[
        ("mode", "mode: nftables"),
        (
            "nftables",
            "nftables:\n  masqueradeBit: 12\n  syncPeriod: 0s\n  minSyncPeriod: 0s\n  masqueradeAll: false",
        ),
        ("nodePortAddresses", "nodePortAddresses: [all]"),
    ]);
    let (_, findings) = resolve(&text, &[]);
    assert_eq!(
        fields(&findings, Severity::Error),
        ["nftables.masqueradeBit"]
    );
    let (_, findings) = resolve(&text, &["--backend", "ebpf"]);
    assert_eq!(fields(&findings, Severity::Error), Vec::<&str>::new());
    assert!(fields(&findings, Severity::Warning).contains(&"nftables.masqueradeBit"));
    let e = apply(
        &parse(&text.replace("masqueradeBit: 12", "masqueradeBit: 32")).unwrap(),
        &run_args(&[]),
    )
    .unwrap_err();
    assert_eq!(e.field, "nftables.masqueradeBit");
}

#[test]
fn unknown_fields_are_warnings_naming_them() {
    let text = kubeadm_with(&[
        ("udpIdleTimeout", "udpIdleTimeout: 250ms"),
        ("conntrack", "conntrack:\n  maxPerSocket: 3"),
        (
            "iptables",
            "iptables:\n  localhostNodePorts: false\n  snatNodeInternalIP: true",
        ),
    ]);
    let (_, findings) = resolve(&text, &[]);
    let unknown: Vec<&str> = findings
        .iter()
        .filter(|f| f.message.contains("not a field of"))
        .map(|f| f.field.as_str())
        .collect();
    assert_eq!(
        unknown,
        [
            "conntrack.maxPerSocket",
            "iptables.snatNodeInternalIP",
            "udpIdleTimeout"
        ]
    );
    assert!(findings.iter().all(|f| f.severity == Severity::Warning));
}

#[test]
fn malformed_values_name_their_field() {
    let cases = [
        (
            KUBEADM_CONFIG_CONF.replace("maxPerCore: null", "maxPerCore: lots"),
            "conntrack.maxPerCore",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("maxPerCore: null", "maxPerCore: 4294967296"),
            "conntrack.maxPerCore",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("udpTimeout: 0s\ndetect", "udpTimeout: 30\ndetect"),
            "conntrack.udpTimeout",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("  syncPeriod: 0s\nipvs", "  syncPeriod: 5 minutes\nipvs"),
            "iptables.syncPeriod",
        ),
        (
            KUBEADM_CONFIG_CONF.replace(
                "  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs",
                "  minSyncPeriod: -1s\n  syncPeriod: 0s\nipvs",
            ),
            "iptables.minSyncPeriod",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("enableProfiling: false", "enableProfiling: maybe"),
            "enableProfiling",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("nodePortAddresses: null", "nodePortAddresses: 10.0.0.0/8"),
            "nodePortAddresses",
        ),
        (
            KUBEADM_CONFIG_CONF.replace(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1",
                "apiVersion: v1",
            ),
            "apiVersion",
        ),
        (
            KUBEADM_CONFIG_CONF
                .replace("kind: KubeProxyConfiguration", "kind: KubeletConfiguration"),
            "kind",
        ),
        ("- a\n- b\n".to_string(), "<document>"),
        ("mode: [".to_string(), "<document>"),
    ];
    for (text, field) in cases {
        let e = parse(&text).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
    let cases = [
        (
            KUBEADM_CONFIG_CONF.replace(
                "clusterCIDR: 10.244.0.0/16",
                "clusterCIDR: 10.244.0.0/16,10.300.0.0/16",
            ),
            "clusterCIDR",
        ),
        (
            KUBEADM_CONFIG_CONF.replace(
                "nodePortAddresses: null",
                "nodePortAddresses: [all, 10.0.0/8]",
            ),
            "nodePortAddresses[1]",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("min: null", "min: -1"),
            "conntrack.min",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("udpTimeout: 0s\ndetect", "udpTimeout: 500ms\ndetect"),
            "conntrack.udpTimeout",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("mode: \"\"", "mode: userspace"),
            "mode",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("detectLocalMode: \"\"", "detectLocalMode: Magic"),
            "detectLocalMode",
        ),
        (
            KUBEADM_CONFIG_CONF.replace(
                "healthzBindAddress: \"\"",
                "healthzBindAddress: localhost:1",
            ),
            "healthzBindAddress",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("bindAddress: 0.0.0.0", "bindAddress: node-1"),
            "bindAddress",
        ),
        (
            KUBEADM_CONFIG_CONF.replace("oomScoreAdj: null", "oomScoreAdj: -1001"),
            "oomScoreAdj",
        ),
    ];
    for (text, field) in cases {
        let e = apply(&parse(&text).unwrap(), &run_args(&[])).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn json_reads_like_yaml() {
    let json = r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": "nftables", "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
        "nftables": {"minSyncPeriod": "2s", "syncPeriod": null},
        "conntrack": {"tcpCloseWaitTimeout": "1h0m0s", "maxPerCore": 0}}"#;
    let (a, findings) = resolve(json, &[]);
    assert_eq!(a.backend, Backend::Nftables);
    assert_eq!(a.cluster_cidr.len(), 2);
    assert_eq!(a.min_sync_period, Duration::from_secs(2));
    assert_eq!(a.sync_period, Duration::from_secs(30));
    assert_eq!(a.conntrack_max_per_core, 0);
    assert_eq!(
        a.nodeport_addresses,
        [NodePortAddress::Primary],
        "nftables mode: an unset list is the Node's primary addresses, as kube-proxy has it"
    );
    assert!(findings.is_empty(), "{findings:?}");
}

#[test]
fn primary_node_port_addresses_are_taken_as_kube_proxy_takes_them() {
    let text = kubeadm_with(&[("nodePortAddresses", "nodePortAddresses: [primary]")]);
    let (a, findings) = resolve(&text, &[]);
    assert_eq!(a.nodeport_addresses, [NodePortAddress::Primary]);
    assert!(
        !findings
            .iter()
            .any(|f| f.field.starts_with("nodePortAddresses")),
        "{findings:?}"
    );
    // iptables mode (kubeadm's "") leaves an unset list to every node address.
    let (a, _) = resolve(KUBEADM_CONFIG_CONF, &[]);
    assert!(a.nodeport_addresses.is_empty());
    // The flag takes it too.
    let (a, _) = resolve(
        KUBEADM_CONFIG_CONF,
        &["--nodeport-addresses", "primary,10.0.0.0/8"],
    );
    assert_eq!(
        a.nodeport_addresses,
        [
            NodePortAddress::Primary,
            NodePortAddress::Cidr("10.0.0.0/8".parse().unwrap())
        ]
    );
}

#[test]
fn go_durations() {
    let ok = [
        ("0", 0),
        ("0s", 0),
        ("1s", 1_000),
        ("250ms", 250),
        ("1h0m0s", 3_600_000),
        ("15m0s", 900_000),
        ("1.5h", 5_400_000),
        ("2m30.5s", 150_500),
        ("+3s", 3_000),
        ("1500us", 1),
    ];
    for (s, ms) in ok {
        assert_eq!(parse_go_duration(s).unwrap().as_millis(), ms, "{s}");
    }
    for bad in ["", "5", "-1s", "1x", "s", "1..5s", "1s2"] {
        assert!(parse_go_duration(bad).is_err(), "{bad}");
    }
}
