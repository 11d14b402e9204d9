//! The clock controllers read (client-go's `clock.Clock`): the system clock in production, a
//! [`FakeClock`] that moves only when told to in tests. The batch controllers (Job, CronJob,
//! ttl-after-finished) take one in their config so tests can move time.

use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;

/// Where a controller gets the time from.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct FakeClock(Mutex<Timestamp>);

impl FakeClock {
    /// A clock standing at `t`.
    pub fn new(t: Timestamp) -> Self {
        Self(Mutex::new(t))
    }

    /// Sets the time.
    pub fn set(&self, t: Timestamp) {
        *self.0.lock().expect("clock lock") = t;
    }

    /// Moves the time forward.
    pub fn step(&self, d: Duration) {
        let mut t = self.0.lock().expect("clock lock");
        *t = t.checked_add(d).expect("clock in range");
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().expect("clock lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn fake_clock_moves_only_when_told() {
        let c = FakeClock::new(ts("2026-11-26T00:00:00Z"));
        assert_eq!(c.now(), ts("2026-11-26T00:00:00Z"));
        c.step(Duration::from_secs(61));
        assert_eq!(c.now(), ts("2026-11-26T00:01:01Z"));
        c.set(ts("2030-01-01T00:00:00Z"));
        assert_eq!(c.now(), ts("2030-01-01T00:00:00Z"));
    }
}
