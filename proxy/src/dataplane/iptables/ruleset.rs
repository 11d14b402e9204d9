//! The fixed part of the iptables layout: the jumps from the built-in chains to ours and the
//! node-wide rules of the shared chains (masquerade, filter, node ports), rebuilt on a full sync
//! when the node's inputs change.

use super::*;

/// Jump rules in built-in chains: (table, chain, rule).
pub(super) const HOOKS: &[(&str, &str, &str)] = &[
    (
        "nat",
        "PREROUTING",
        "-m comment --comment kpr-services -j KPR-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "-m comment --comment kpr-services -j KPR-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "-m comment --comment kpr-postrouting -j KPR-POSTROUTING",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -m comment --comment kpr-checks -j KPR-FILTER",
    ),
];

impl Iptables {
    pub(super) fn statics_key(&self, state: &ProxyState) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{}",
            state.node.cluster_cidrs,
            state.node.node_ips,
            self.cfg.nodeport_addresses,
            self.cfg.service_cidrs,
            state.node.masquerade_all
        )
    }

    /// Static rules of our shared chains (nat, filter).
    pub(super) fn static_rules(
        &self,
        node: &crate::selection::NodeContext,
    ) -> (Vec<String>, Vec<String>) {
        let mut nat = vec![
            format!(
                "-A {MARK_MASQ_CHAIN} -j MARK --or-mark {:#x}",
                compile::MARK_MASQ
            ),
            format!("-A {POSTROUTING} -m conntrack --ctstate DNAT -j {HAIRPIN}"),
            format!(
                "-A {POSTROUTING} -m mark ! --mark {m:#x}/{m:#x} -j RETURN",
                m = compile::MARK_MASQ
            ),
            format!(
                "-A {POSTROUTING} -j MARK --xor-mark {:#x}",
                compile::MARK_MASQ
            ),
            format!("-A {POSTROUTING} -j MASQUERADE"),
            format!("-A {MASQ_EXTERNAL} -m addrtype --src-type LOCAL -j RETURN"),
        ];
        for c in &node.cluster_cidrs {
            if let ipnet::IpNet::V4(n) = c {
                nat.push(format!("-A {MASQ_EXTERNAL} -s {} -j RETURN", n.trunc()));
            }
        }
        nat.push(format!("-A {MASQ_EXTERNAL} -j {MARK_MASQ_CHAIN}"));
        let v4nets: Vec<String> = self
            .cfg
            .nodeport_addresses
            .iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V4(n) if !n.network().is_loopback() => Some(n.trunc().to_string()),
                _ => None,
            })
            .collect();
        if v4nets.is_empty() {
            nat.push(format!(
                "-A {SERVICES} -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j {NODEPORTS}"
            ));
        } else {
            for n in v4nets {
                nat.push(format!("-A {SERVICES} -d {n} -j {NODEPORTS}"));
            }
        }
        let mut filter = vec![
            format!(
                "-A {FILTER} -m mark --mark {m:#x}/{m:#x} -j DROP",
                m = compile::MARK_DROP
            ),
            format!(
                "-A {FILTER} -p tcp -m mark --mark {m:#x}/{m:#x} -j REJECT --reject-with tcp-reset",
                m = compile::MARK_REJECT
            ),
            format!(
                "-A {FILTER} -m mark --mark {m:#x}/{m:#x} -j REJECT",
                m = compile::MARK_REJECT
            ),
        ];
        // Only destinations still inside a service CIDR after NAT were not translated: the
        // per-clusterIP list is walked for those alone, not for every new connection.
        let service_cidrs: Vec<String> = self
            .cfg
            .service_cidrs
            .iter()
            .filter_map(|c| match c {
                ipnet::IpNet::V4(n) => Some(n.trunc().to_string()),
                ipnet::IpNet::V6(_) => None,
            })
            .collect();
        if service_cidrs.is_empty() {
            filter.push(format!("-A {FILTER} -j {CLUSTER_IPS}"));
        }
        for n in &service_cidrs {
            filter.push(format!("-A {FILTER} -d {n} -j {CLUSTER_IPS}"));
        }
        for n in &service_cidrs {
            filter.push(format!("-A {FILTER} -d {n} -j DROP"));
        }
        (nat, filter)
    }

    pub(super) fn cluster_ip_rules(ip: Ipv4Addr) -> [String; 2] {
        [
            format!("{CLUSTER_IPS} -d {ip}/32 -p tcp -j REJECT --reject-with tcp-reset"),
            format!("{CLUSTER_IPS} -d {ip}/32 -j REJECT"),
        ]
    }
}
