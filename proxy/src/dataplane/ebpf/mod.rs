//! The eBPF dataplane: socket-level load balancing with cgroup programs (and tc for traffic from
//! outside the node), driven by hash maps that this module fills from the selected endpoints.
//!
//! Owns: the embedded eBPF object, loading and attaching it, pinning under bpffs, and the map
//! contents. It never decides which endpoints are usable (`selection` does).

pub mod object;
