//! The default plugins, one module each, as kube-scheduler v1.34 registers them. Every plugin is
//! pure over the [`Snapshot`](super::framework::Snapshot) and the Pod: no I/O, no clocks.
