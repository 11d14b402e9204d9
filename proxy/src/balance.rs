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

/// Indices `0..n` in round-robin order starting at `cursor`.
pub fn from_cursor(n: usize, cursor: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (cursor + k) % n.max(1))
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
}
