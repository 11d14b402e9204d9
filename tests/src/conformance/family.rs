//! The address family a scenario runs in. The scenario table is written in IPv4; in IPv6 every
//! address of it (in manifests, probe targets, expected `/state` endpoints) is mapped onto the
//! dual-stack cluster's IPv6 plan (see `crate::cluster`):
//!
//! ```text
//! 10.96.0.X       -> fd00:10:96::X          (service CIDR 10.96.0.0/16 -> fd00:10:96::/112)
//! 10.244.A.B      -> fd00:10:244:<A hex>::B (pods, pod client, node link addresses)
//! 192.0.2.X       -> 2001:db8:2::X          (node and external client)
//! 198.51.100.X    -> 2001:db8:51::X, 203.0.113.X -> 2001:db8:113::X (external and LB IPs)
//! ```
//!
//! The last group of digits is kept as written (so `192.0.2.100` is `2001:db8:2::100`, the
//! client's address). Only well-formed IPv4 literals are mapped: a scenario's deliberately invalid
//! address stays invalid. `addressType: IPv4` slices become `IPv6` ones.
//!
//! Dual-stack runs keep the IPv4 table and add the IPv6 side to it: every Service with an IPv4
//! clusterIP becomes `RequireDualStack` with both clusterIPs (and both families of externalIPs,
//! load-balancer IPs and source ranges), every IPv4 EndpointSlice gets an IPv6 twin, and every
//! connection step runs once per family.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{json, Value};

use crate::cluster::NODE_IP6;

/// The address family of a conformance run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
    /// Dual-stack Services, reached over both families.
    Dual,
}

impl Family {
    /// The families a connection step of this run goes over, one after the other.
    pub fn connections(self) -> &'static [Family] {
        match self {
            Family::V4 => &[Family::V4],
            Family::V6 => &[Family::V6],
            Family::Dual => &[Family::V4, Family::V6],
        }
    }

    /// The scenario's manifests for this run.
    pub fn manifests(self, text: &str) -> String {
        match self {
            Family::V4 => text.to_string(),
            Family::V6 => to_v6_text(text),
            Family::Dual => to_dual_text(text),
        }
    }

    /// The endpoints `/state` lists for a port the table gives `n` (each twice in dual-stack).
    pub fn endpoint_count(self, n: usize) -> usize {
        match self {
            Family::Dual => 2 * n,
            _ => n,
        }
    }

    /// The `/state` endpoint addresses for the table's `ip:port` list.
    pub fn state_endpoints(self, eps: &[&str]) -> Vec<String> {
        match self {
            Family::Dual => eps
                .iter()
                .map(|e| e.to_string())
                .chain(eps.iter().map(|e| to_v6_text(e)))
                .collect(),
            f => eps.iter().map(|e| f.text(e)).collect(),
        }
    }

    /// An `ip:port` or address of the table as one connection family reaches it (a dual-stack
    /// run connects over each family in turn: see [`Family::connections`]).
    pub fn text(self, text: &str) -> String {
        match self {
            Family::V4 => text.to_string(),
            Family::V6 => to_v6_text(text),
            Family::Dual => panic!("a connection is IPv4 or IPv6: use Family::connections"),
        }
    }

    /// An address of the table as one connection family has it.
    pub fn addr(self, ip: Ipv4Addr) -> IpAddr {
        match self {
            Family::V4 => ip.into(),
            Family::V6 => map_addr(ip)
                .unwrap_or_else(|| panic!("no IPv6 counterpart for {ip} in the conformance plan"))
                .into(),
            Family::Dual => panic!("a connection is IPv4 or IPv6: use Family::connections"),
        }
    }
}

/// The dual-stack form of a scenario's manifests (documents that do not parse are kept as they
/// are: the bad-input scenarios' own).
fn to_dual_text(text: &str) -> String {
    text.split("---\n")
        .flat_map(|doc| match serde_saphyr::from_str::<Value>(doc) {
            Ok(v) => dual_objects(v)
                .iter()
                .map(|o| serde_saphyr::to_string(o).expect("JSON values always render as YAML"))
                .collect(),
            Err(_) => vec![doc.to_string()],
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One object in dual-stack form: a Service with both families' addresses, an IPv4 slice and its
/// IPv6 twin, anything else as it is.
fn dual_objects(mut v: Value) -> Vec<Value> {
    let v6 = |s: &str| to_v6_text(s);
    let mapped = |arr: &Value| -> Vec<Value> {
        arr.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|s| {
                s.split('/')
                    .next()
                    .is_some_and(|a| a.parse::<Ipv4Addr>().is_ok())
            })
            .map(|s| json!(v6(s)))
            .collect()
    };
    match v["kind"].as_str() {
        Some("Service") => {
            let spec = &mut v["spec"];
            if let Some(ip) = spec["clusterIP"]
                .as_str()
                .filter(|s| s.parse::<Ipv4Addr>().is_ok())
            {
                let ip = ip.to_string();
                spec["clusterIPs"] = json!([ip, v6(&ip)]);
                spec["ipFamilies"] = json!(["IPv4", "IPv6"]);
                spec["ipFamilyPolicy"] = json!("RequireDualStack");
            }
            for field in ["externalIPs", "loadBalancerSourceRanges"] {
                let extra = mapped(&spec[field]);
                if let Some(a) = spec[field].as_array_mut() {
                    a.extend(extra);
                }
            }
            let ingress = &mut v["status"]["loadBalancer"]["ingress"];
            let extra: Vec<Value> = ingress
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str())
                .map(|ip| json!({"ip": v6(ip)}))
                .collect();
            if let Some(a) = ingress.as_array_mut() {
                a.extend(extra);
            }
            vec![v]
        }
        Some("EndpointSlice") if v["addressType"] == "IPv4" => {
            let mut twin = v.clone();
            twin["addressType"] = json!("IPv6");
            if let Some(name) = v["metadata"]["name"].as_str() {
                twin["metadata"]["name"] = json!(format!("{name}-v6"));
            }
            for ep in twin["endpoints"].as_array_mut().into_iter().flatten() {
                ep["addresses"] = json!(mapped(&ep["addresses"]));
            }
            vec![v, twin]
        }
        _ => vec![v],
    }
}

/// Whether `ip` is one of the node's own addresses (what a masqueraded connection shows): the
/// node address or a node-side pod link address, of either family.
pub fn is_node_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4 == crate::cluster::NODE_IP || (v4.octets()[..2] == [10, 244] && v4.octets()[3] == 1)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            v6 == NODE_IP6 || (s[..3] == [0xfd00, 0x10, 0x244] && s[4..] == [0, 0, 0, 1])
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
            Family::Dual => "dual-stack",
        })
    }
}

/// The IPv6 counterpart of one table address.
fn map_addr(ip: Ipv4Addr) -> Option<Ipv6Addr> {
    let [a, b, c, d] = ip.octets();
    // The last octet's decimal digits read as hex (192.0.2.100 -> ::100).
    let last = u16::from_str_radix(&d.to_string(), 16).ok()?;
    let v6 = match (a, b, c) {
        (10, 96, 0) => Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, last),
        (10, 244, c) => Ipv6Addr::new(0xfd00, 0x10, 0x244, c.into(), 0, 0, 0, last),
        (192, 0, 2) => Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, last),
        (198, 51, 100) => Ipv6Addr::new(0x2001, 0xdb8, 0x51, 0, 0, 0, 0, last),
        (203, 0, 113) => Ipv6Addr::new(0x2001, 0xdb8, 0x113, 0, 0, 0, 0, last),
        _ => return None,
    };
    Some(v6)
}

/// The IPv6 prefix length of a table network.
fn map_prefix(ip: Ipv4Addr, len: u8) -> Option<u8> {
    match (ip.octets(), len) {
        (_, 32) => Some(128),
        ([10, 244, 0, 0], 16) => Some(48),
        ([10, 96, 0, 0], 16) | ([192, 0, 2, 0], 24) | ([203, 0, 113, 0], 24) => Some(112),
        _ => None,
    }
}

/// Rewrites every IPv4 literal (with its `/len` or `:port`) of `text`.
fn to_v6_text(text: &str) -> String {
    let text = text.replace("addressType: IPv4", "addressType: IPv6");
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 64);
    let mut i = 0;
    while i < bytes.len() {
        let starts_token =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.');
        if starts_token && bytes[i].is_ascii_digit() {
            if let Some((len, replaced)) = literal_at(&text[i..]) {
                out.push_str(&replaced);
                i += len;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// An IPv4 literal at the start of `s` (with `/len` or `:port`): its length and IPv6 form.
fn literal_at(s: &str) -> Option<(usize, String)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let candidate = &s[..end];
    if candidate.split('.').count() != 4 {
        return None;
    }
    let ip: Ipv4Addr = candidate.parse().ok()?;
    let v6 = map_addr(ip)
        .unwrap_or_else(|| panic!("no IPv6 counterpart for {ip} in the conformance plan"));
    let rest = &s[end..];
    let digits = |r: &str| r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
    if let Some(after) = rest.strip_prefix('/') {
        let n = digits(after);
        let len: u8 = after[..n].parse().ok()?;
        let len6 = map_prefix(ip, len).unwrap_or_else(|| {
            panic!("no IPv6 counterpart for {ip}/{len} in the conformance plan")
        });
        return Some((end + 1 + n, format!("{v6}/{len6}")));
    }
    if let Some(after) = rest.strip_prefix(':') {
        let n = digits(after);
        if n > 0 {
            return Some((end + 1 + n, format!("[{v6}]:{}", &after[..n])));
        }
    }
    Some((end, v6.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_addresses_map_onto_the_cluster_plan() {
        let f = Family::V6;
        assert_eq!(f.text("10.96.0.10:80"), "[fd00:10:96::10]:80");
        assert_eq!(f.text("192.0.2.1:30080"), "[2001:db8:2::1]:30080");
        assert_eq!(
            f.addr("192.0.2.100".parse().unwrap()),
            crate::cluster::CLIENT_IP6
        );
        assert_eq!(
            f.addr("10.244.200.2".parse().unwrap()),
            crate::cluster::PODCLIENT_IP6
        );
        assert_eq!(f.text("10.244.1.2"), "fd00:10:244:1::2");
        assert_eq!(f.text("lb: 203.0.113.0/24, x"), "lb: 2001:db8:113::/112, x");
        assert_eq!(f.text("10.244.0.0/16"), "fd00:10:244::/48");
        // Not addresses, or not well formed: untouched.
        assert_eq!(f.text("clusterIP: 10.96.0.300"), "clusterIP: 10.96.0.300");
        assert_eq!(f.text("v1.2.3 and 10.0.0"), "v1.2.3 and 10.0.0");
        assert_eq!(
            f.text("addressType: IPv4\nendpoints:\n- addresses: [10.244.3.2]"),
            "addressType: IPv6\nendpoints:\n- addresses: [fd00:10:244:3::2]"
        );
        assert_eq!(Family::V4.text("10.96.0.10:80"), "10.96.0.10:80");
    }

    #[test]
    fn dual_stack_manifests_carry_both_families() {
        use crate::manifest::{yaml, EndpointSlice, Service};
        let svc = Service::new("web")
            .cluster_ip("10.96.0.10")
            .tcp(80, 8080)
            .load_balancer("198.51.100.10")
            .lb_source_range("203.0.113.0/24");
        let slice = EndpointSlice::for_service(&svc).ready("10.244.1.2");
        let text = Family::Dual.manifests(&yaml(&[&svc, &slice]));
        let docs: Vec<Value> = text
            .split("---\n")
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 3, "{text}");
        let spec = &docs[0]["spec"];
        assert_eq!(spec["clusterIPs"], json!(["10.96.0.10", "fd00:10:96::10"]));
        assert_eq!(spec["ipFamilyPolicy"], "RequireDualStack");
        assert_eq!(
            spec["loadBalancerSourceRanges"],
            json!(["203.0.113.0/24", "2001:db8:113::/112"])
        );
        assert_eq!(
            docs[0]["status"]["loadBalancer"]["ingress"][1]["ip"],
            "2001:db8:51::10"
        );
        assert_eq!(docs[1]["addressType"], "IPv4");
        assert_eq!(docs[2]["addressType"], "IPv6");
        assert_eq!(
            docs[2]["endpoints"][0]["addresses"],
            json!(["fd00:10:244:1::2"])
        );
        assert_eq!(Family::Dual.endpoint_count(4), 8);
    }

    #[test]
    fn node_addresses_of_both_families() {
        for f in [Family::V4, Family::V6] {
            assert!(is_node_address(f.addr("192.0.2.1".parse().unwrap())));
            assert!(is_node_address(f.addr("10.244.3.1".parse().unwrap())));
            assert!(!is_node_address(f.addr("10.244.3.2".parse().unwrap())));
        }
    }
}
