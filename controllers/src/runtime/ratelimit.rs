//! The client-side request rate limit of kube-controller-manager's `--kube-api-qps` /
//! `--kube-api-burst` and kube-scheduler's `clientConnection.qps` / `burst`: client-go's token
//! bucket in front of every request the process's client sends (watch starts included), as a
//! tower layer on kube's client stack. Owns only the limit; which value a binary uses is its
//! flags' business.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::runtime::queue::Bucket;

/// `qps` requests a second on average, `burst` at once after a quiet spell. A `qps` of zero or
/// below means no limit (client-go builds no rate limiter for a negative QPS).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientLimit {
    pub qps: f32,
    pub burst: u32,
}

impl ClientLimit {
    /// The layer enforcing this limit, or None for no limit.
    pub fn layer(self) -> Option<RateLimitLayer> {
        (self.qps > 0.0).then(|| RateLimitLayer {
            bucket: Arc::new(Mutex::new(Bucket::full_at(
                f64::from(self.qps),
                self.burst.max(1),
                Instant::now().into_std(),
            ))),
        })
    }
}

/// Wraps a service so that each request first waits for a token of one shared bucket.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            wait: None,
            reserved: false,
        }
    }
}

/// The rate-limited service: not ready until it holds a token (kube's client puts a buffer in
/// front, so waiting requests queue there, in order).
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
    wait: Option<Pin<Box<Sleep>>>,
    /// A token is held for the next call.
    reserved: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.reserved {
            if self.wait.is_none() {
                let now = Instant::now();
                let delay: Duration = self
                    .bucket
                    .lock()
                    .expect("rate limit lock")
                    .reserve(now.into_std());
                self.wait = Some(Box::pin(tokio::time::sleep_until(now + delay)));
            }
            let wait = self.wait.as_mut().expect("set above");
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
            self.reserved = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.reserved = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{ready, Ready};

    use tower::ServiceExt as _;

    use super::*;

    /// Answers every request at once with the time it was called.
    #[derive(Clone)]
    struct Clock;

    impl Service<()> for Clock {
        type Response = Instant;
        type Error = Infallible;
        type Future = Ready<Result<Instant, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: ()) -> Self::Future {
            ready(Ok(Instant::now()))
        }
    }

    /// Lower bounds only (a loaded machine may run any request later, none can run sooner);
    /// the bucket's arithmetic itself is tested in runtime::queue.
    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_their_tokens() {
        let limit = ClientLimit {
            qps: 20.0,
            burst: 3,
        };
        let mut svc = limit.layer().expect("a limit").layer(Clock);
        let start = Instant::now();
        for i in 0..6u32 {
            let at = svc.ready().await.unwrap().call(()).await.unwrap() - start;
            let earliest = Duration::from_millis(50) * i.saturating_sub(2);
            assert!(at >= earliest, "request {i} at {at:?}, before {earliest:?}");
        }
    }

    #[test]
    fn zero_or_negative_qps_is_no_limit() {
        for qps in [0.0, -1.0] {
            assert!(ClientLimit { qps, burst: 30 }.layer().is_none(), "{qps}");
        }
    }
}
