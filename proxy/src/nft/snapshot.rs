//! A table as `nft -j list table` prints it, for reading back what the kernel holds (`proxy
//! trace` of the nftables and userspace backends): its sets and maps with their elements, the
//! rules of its chains, and lookups of addresses and concatenated keys in them (prefixes and
//! ranges included).

use std::net::IpAddr;

use serde_json::Value;

use crate::model::IpFamily;

/// One table as `nft -j list table` prints it: its sets and maps with their elements, and its
/// chains' rules (as JSON, searched for the references the trace needs).
#[derive(Debug, Clone, Default)]
pub struct TableSnapshot {
    pub family: Option<IpFamily>,
    /// name -> elements (`elem` of a set or map; absent when empty).
    sets: std::collections::HashMap<String, Vec<Value>>,
    /// chain name -> its rules' expressions.
    chains: std::collections::HashMap<String, Vec<Value>>,
}

impl TableSnapshot {
    /// Parses the output of `nft -j list table <family> kpr`.
    pub fn parse(json: &str) -> Result<TableSnapshot, String> {
        let doc: Value = serde_json::from_str(json).map_err(|e| format!("nft -j output: {e}"))?;
        let items = doc["nftables"]
            .as_array()
            .ok_or("nft -j output without an `nftables` list")?;
        let mut t = TableSnapshot::default();
        for item in items {
            if let Some(s) = item.get("set").or_else(|| item.get("map")) {
                let name = s["name"].as_str().unwrap_or_default().to_string();
                let elems = s["elem"].as_array().cloned().unwrap_or_default();
                t.sets.insert(name, elems);
                if t.family.is_none() {
                    t.family = match s["family"].as_str() {
                        Some("ip") => Some(IpFamily::V4),
                        Some("ip6") => Some(IpFamily::V6),
                        _ => None,
                    };
                }
            } else if let Some(r) = item.get("rule") {
                let chain = r["chain"].as_str().unwrap_or_default().to_string();
                t.chains.entry(chain).or_default().push(r["expr"].clone());
            }
        }
        Ok(t)
    }

    pub fn elems(&self, set: &str) -> &[Value] {
        self.sets.get(set).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether `set` (of addresses, prefixes or ranges) holds `addr`.
    pub fn has_addr(&self, set: &str, addr: IpAddr) -> bool {
        self.elems(set).iter().any(|e| addr_matches(e, addr))
    }

    /// Whether a set of concatenated keys holds `key` exactly.
    pub fn has_key(&self, set: &str, key: &[Value]) -> bool {
        self.elems(set).iter().any(|e| key_matches(e, key))
    }

    /// The data of `map` for `key` (a concatenation, or one value).
    pub fn lookup(&self, map: &str, key: &[Value]) -> Option<&Value> {
        self.elems(map).iter().find_map(|e| {
            let pair = e.as_array()?;
            let (k, v) = (pair.first()?, pair.get(1)?);
            key_matches(k, key).then_some(v)
        })
    }

    /// Whether some rule of `chain` refers to `@set`.
    pub fn chain_uses(&self, chain: &str, set: &str) -> bool {
        let needle = format!("\"@{set}\"");
        self.chains
            .get(chain)
            .is_some_and(|rules| rules.iter().any(|r| r.to_string().contains(&needle)))
    }
}

pub fn addr_matches(e: &Value, addr: IpAddr) -> bool {
    let parse = |v: &Value| v.as_str().and_then(|s| s.parse::<IpAddr>().ok());
    if let Some(a) = parse(e) {
        return a == addr;
    }
    if let Some(p) = e.get("prefix") {
        let (Some(a), Some(len)) = (parse(&p["addr"]), p["len"].as_u64()) else {
            return false;
        };
        return ipnet::IpNet::new(a, len as u8).is_ok_and(|n| n.contains(&addr));
    }
    if let Some(r) = e.get("range").and_then(Value::as_array) {
        if let (Some(lo), Some(hi)) = (r.first().and_then(parse), r.get(1).and_then(parse)) {
            return lo <= addr && addr <= hi;
        }
    }
    if let Some(inner) = e.get("elem") {
        return addr_matches(&inner["val"], addr);
    }
    false
}

/// Whether an element key (`{"concat": [...]}` or one value, possibly wrapped in `elem`)
/// matches `key`; an address part may be a prefix or a range.
pub fn key_matches(e: &Value, key: &[Value]) -> bool {
    if let Some(inner) = e.get("elem") {
        return key_matches(&inner["val"], key);
    }
    let parts: Vec<&Value> = match e.get("concat").and_then(Value::as_array) {
        Some(parts) => parts.iter().collect(),
        None => vec![e],
    };
    parts.len() == key.len()
        && parts.iter().zip(key).all(|(p, k)| {
            if *p == k {
                return true;
            }
            match k.as_str().and_then(|s| s.parse::<IpAddr>().ok()) {
                Some(addr) => addr_matches(p, addr),
                None => false,
            }
        })
}

/// `nft -j list table FAMILY NAME` in this network namespace, parsed.
pub fn read(family: &str, name: &str) -> Result<TableSnapshot, crate::error::DataplaneError> {
    let json = super::query(&["-j", "list", "table", family, name])?;
    TableSnapshot::parse(&json).map_err(crate::error::DataplaneError::Other)
}
