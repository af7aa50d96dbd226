//! Whether this worker may presume other workers dead from their heartbeats (pure; time is
//! passed in). A heartbeat goes silent when its worker dies, but also when Redis is out of
//! reach or stalls, and then every worker's goes silent alike, this one's included. So a
//! worker judges others only while its own heartbeats have gone through without a gap for
//! at least the dead-after time and the last one is recent: a peer silent that long then had
//! the same working Redis to write to. (Judging wrongly is safe, only wasteful: the holder
//! is fenced at its next write and its jobs resume elsewhere.)

use std::time::{Duration, Instant};

/// This worker's own record of reaching the broker with its heartbeats.
#[derive(Debug, Default)]
pub(crate) struct Contact {
    /// Since when heartbeats have gone through with no gap longer than the dead-after time.
    since: Option<Instant>,
    /// When the last heartbeat went through.
    last_ok: Option<Instant>,
}

impl Contact {
    /// A heartbeat went through at `at` (when its reply came).
    pub fn beat_ok(&mut self, at: Instant, dead_after: Duration) {
        let gap = self
            .last_ok
            .is_none_or(|last| at.saturating_duration_since(last) > dead_after);
        if gap || self.since.is_none() {
            self.since = Some(at);
        }
        self.last_ok = Some(at);
    }

    /// A heartbeat failed.
    pub fn beat_failed(&mut self) {
        self.since = None;
    }

    /// Whether at `now` this worker may presume dead the workers whose heartbeats are
    /// older than `dead_after`.
    pub fn may_judge(&self, now: Instant, dead_after: Duration) -> bool {
        let long_enough = self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= dead_after);
        let recent = self
            .last_ok
            .is_some_and(|l| now.saturating_duration_since(l) <= dead_after);
        long_enough && recent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD: Duration = Duration::from_secs(3);

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn judges_only_after_a_streak_of_dead_after() {
        let t0 = Instant::now();
        let mut c = Contact::default();
        assert!(!c.may_judge(t0, DEAD));
        for i in 0..=3 {
            c.beat_ok(t0 + s(f64::from(i)), DEAD);
        }
        assert!(!c.may_judge(t0 + s(2.9), DEAD));
        assert!(c.may_judge(t0 + s(3.0), DEAD));
        assert!(c.may_judge(t0 + s(6.0), DEAD));
        // its own beats stopped going through long ago: it cannot tell anything now
        assert!(!c.may_judge(t0 + s(6.1), DEAD));
    }

    #[test]
    fn a_failed_beat_or_a_long_gap_starts_the_streak_again() {
        let t0 = Instant::now();
        let mut c = Contact::default();
        for i in 0..5 {
            c.beat_ok(t0 + s(f64::from(i)), DEAD);
        }
        assert!(c.may_judge(t0 + s(4.5), DEAD));
        c.beat_failed();
        assert!(!c.may_judge(t0 + s(4.6), DEAD));
        c.beat_ok(t0 + s(5.0), DEAD);
        assert!(!c.may_judge(t0 + s(7.9), DEAD));
        c.beat_ok(t0 + s(7.0), DEAD);
        assert!(c.may_judge(t0 + s(8.0), DEAD));
        // a beat that took 6 s to answer (Redis stalled): everyone's beats were stuck
        c.beat_ok(t0 + s(14.0), DEAD);
        assert!(!c.may_judge(t0 + s(14.5), DEAD));
        c.beat_ok(t0 + s(15.0), DEAD);
        c.beat_ok(t0 + s(16.0), DEAD);
        c.beat_ok(t0 + s(17.0), DEAD);
        assert!(c.may_judge(t0 + s(17.0), DEAD));
    }
}
