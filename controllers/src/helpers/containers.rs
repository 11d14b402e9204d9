//! Which of a Pod's containers run for its whole life, as upstream's helpers count them for ports
//! and resources: the regular containers, then the restartable init containers (sidecars,
//! `restartPolicy: Always`). Over the API's `Container` and the caches' trimmed container alike.

use k8s_openapi::api::core::v1::Container;

/// A container as far as [`long_running`] reads it.
pub trait RestartPolicy {
    /// The container's `restartPolicy` (init containers only).
    fn restart_policy(&self) -> Option<&str>;
}

impl RestartPolicy for Container {
    fn restart_policy(&self) -> Option<&str> {
        self.restart_policy.as_deref()
    }
}

/// `containers`, then the sidecars among `init_containers`.
pub fn long_running<'a, C: RestartPolicy>(
    containers: &'a [C],
    init_containers: Option<&'a Vec<C>>,
) -> impl Iterator<Item = &'a C> {
    let sidecars = init_containers
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy() == Some("Always"));
    containers.iter().chain(sidecars)
}
