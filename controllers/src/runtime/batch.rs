//! `slowStartBatch` (CTL-10): calls issued in batches of 1, 2, 4, ... so that when most would fail
//! (a quota exhausted, an admission webhook refusing) only a small batch reaches the API server.

use std::future::Future;

/// Calls `f(i)` for `i` in `0..count`, in batches starting at `min(count, initial)` and doubling;
/// a batch's calls run concurrently. Stops after the first batch with a failure: returns how many
/// calls succeeded and the first error; the calls never attempted are not counted as successes.
pub async fn slow_start_batch<F, Fut, E>(count: usize, initial: usize, f: F) -> (usize, Option<E>)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut remaining = count;
    let mut successes = 0;
    let mut next = 0;
    let mut batch = remaining.min(initial.max(1));
    while batch > 0 {
        let results = futures::future::join_all((next..next + batch).map(&f)).await;
        next += batch;
        let mut first_err = None;
        for r in results {
            match r {
                Ok(()) => successes += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if first_err.is_some() {
            return (successes, first_err);
        }
        remaining -= batch;
        batch = remaining.min(2 * batch);
    }
    (successes, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn ctl10_batches_double_and_stop_at_the_first_failing_batch() {
        struct Case {
            name: &'static str,
            count: usize,
            fail_at: Option<usize>,
            want_calls: usize,
            want_successes: usize,
        }
        let cases = [
            Case {
                name: "CTL-10 all succeed: 1+2+4+3",
                count: 10,
                fail_at: None,
                want_calls: 10,
                want_successes: 10,
            },
            Case {
                name: "CTL-10 failure in the third batch (calls 3..7) stops after it",
                count: 10,
                fail_at: Some(4),
                want_calls: 7,
                want_successes: 6,
            },
            Case {
                name: "CTL-10 failure in the first call: nothing else attempted",
                count: 10,
                fail_at: Some(0),
                want_calls: 1,
                want_successes: 0,
            },
            Case {
                name: "CTL-10 zero calls",
                count: 0,
                fail_at: None,
                want_calls: 0,
                want_successes: 0,
            },
        ];
        for c in cases {
            let calls = Mutex::new(Vec::new());
            let (ok, err) = slow_start_batch(c.count, 1, |i| {
                calls.lock().unwrap().push(i);
                let fail = c.fail_at == Some(i);
                async move {
                    if fail {
                        Err("boom")
                    } else {
                        Ok(())
                    }
                }
            })
            .await;
            assert_eq!(calls.lock().unwrap().len(), c.want_calls, "{}", c.name);
            assert_eq!(ok, c.want_successes, "{}", c.name);
            assert_eq!(err.is_some(), c.fail_at.is_some(), "{}", c.name);
        }
    }
}
