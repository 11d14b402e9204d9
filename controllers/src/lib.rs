//! The control plane that feeds the proxy (EndpointSlice controller, LoadBalancer IP allocation) and
//! the workload controllers. Grown in its own issue; see `shared/seeds/DIGEST.md`.
