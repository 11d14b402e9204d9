//! The least-connection pick every balancer shares: the userspace proxy, the rule backends'
//! least-connection controller (`conntrack::leastconn`) and the eBPF trace (which mirrors the
//! eBPF program's own copy, kept in `proxy-ebpf/src/lb.rs` because the verifier needs a bounded
//! loop over map slots).
//!
//! Owns [`least_loaded`] and nothing else; it uses no other module.

/// The least-loaded of the candidates, which come in round-robin order from the balancer's cursor:
/// on a tie the first one wins, so equally loaded endpoints take new connections in turn and
/// least-connection is never less even than round-robin.
pub fn least_loaded<T>(
    candidates_from_cursor: impl IntoIterator<Item = T>,
    load: impl Fn(&T) -> u64,
) -> Option<T> {
    // `min_by_key` keeps the first of equal minima.
    candidates_from_cursor.into_iter().min_by_key(load)
}

/// Every candidate tied for the least load, in the order they came (round-robin order from the
/// cursor). A dataplane that cannot count each connection at once (the rule backends learn of
/// connections from conntrack events) spreads new connections over all of them, so a burst
/// faster than the events is never piled onto one endpoint.
pub fn least_loaded_ties<T>(
    candidates_from_cursor: impl IntoIterator<Item = T>,
    load: impl Fn(&T) -> u64,
) -> Vec<T> {
    let mut ties: Vec<T> = Vec::new();
    let mut least = u64::MAX;
    for c in candidates_from_cursor {
        let l = load(&c);
        if l < least {
            least = l;
            ties.clear();
        }
        if l == least {
            ties.push(c);
        }
    }
    ties
}

/// Indices `0..n` in round-robin order starting at `cursor`.
pub fn from_cursor(n: usize, cursor: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (cursor + k) % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_first_from_the_cursor() {
        let load = [2u64, 1, 1, 3];
        let pick = |cursor| least_loaded(from_cursor(4, cursor), |i| load[*i]);
        assert_eq!(pick(0), Some(1));
        assert_eq!(pick(2), Some(2));
        assert_eq!(pick(3), Some(1));
        assert_eq!(least_loaded(from_cursor(0, 0), |i| load[*i]), None);
    }

    #[test]
    fn ties_are_every_least_loaded_in_cursor_order() {
        let load = [2u64, 1, 3, 1];
        assert_eq!(least_loaded_ties(from_cursor(4, 2), |i| load[*i]), [3, 1]);
        assert_eq!(least_loaded_ties(from_cursor(4, 0), |_| 0), [0, 1, 2, 3]);
        assert!(least_loaded_ties(from_cursor(0, 0), |i| load[*i]).is_empty());
    }
}
