//! The bounded wait every suite's checks poll with.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every `poll` until it gives a value; after `wait`, fails with "timed out after
/// `wait` waiting for `what`" as `failure` words it (adding what the suite knows: the flavour,
/// the controller manager's log).
pub async fn eventually<T, F, Fut>(
    what: &str,
    wait: Duration,
    poll: Duration,
    failure: impl Fn(String) -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < wait,
            "{}",
            failure(format!("timed out after {wait:?} waiting for {what}"))
        );
        tokio::time::sleep(poll).await;
    }
}
