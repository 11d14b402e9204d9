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
        let mine = |n: &&ipnet::IpNet| IpFamily::of(&n.addr()) == self.family;
        for c in node.cluster_cidrs.iter().filter(mine) {
            nat.push(format!("-A {MASQ_EXTERNAL} -s {} -j RETURN", c.trunc()));
        }
        nat.push(format!("-A {MASQ_EXTERNAL} -j {MARK_MASQ_CHAIN}"));
        let nets: Vec<String> = self
            .cfg
            .nodeport_addresses
            .iter()
            .filter(mine)
            .filter(|n| !n.network().is_loopback())
            .map(|n| n.trunc().to_string())
            .collect();
        if nets.is_empty() {
            let loopback = match self.family {
                IpFamily::V4 => "127.0.0.0/8",
                IpFamily::V6 => "::1/128",
            };
            nat.push(format!(
                "-A {SERVICES} -m addrtype --dst-type LOCAL ! -d {loopback} -j {NODEPORTS}"
            ));
        } else {
            for n in nets {
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
            .filter(mine)
            .map(|c| c.trunc().to_string())
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

    pub(super) fn cluster_ip_rules(ip: IpAddr) -> [String; 2] {
        let d = compile::host(ip);
        [
            format!("{CLUSTER_IPS} -d {d} -p tcp -j REJECT --reject-with tcp-reset"),
            format!("{CLUSTER_IPS} -d {d} -j REJECT"),
        ]
    }
}
