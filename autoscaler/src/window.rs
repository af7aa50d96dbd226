//! Time-bucketed sliding averages, as Knative's autoscaler keeps them.
//!
//! Samples land in one-second buckets (several samples in a bucket are averaged); a window
//! average is the mean over the buckets inside the window that received a sample, so a
//! controller that ticks irregularly is not biased towards zero by the ticks it missed.

use std::collections::VecDeque;
use std::time::Duration;

const BUCKET_MS: u128 = 1000;

/// One bucket: its index (start time / bucket width), sample sum and count.
#[derive(Debug, Clone, PartialEq)]
struct Bucket {
    index: u128,
    sum: f64,
    count: u32,
}

/// Sliding window of samples, bounded to a retention period.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    buckets: VecDeque<Bucket>,
    retention: Duration,
}

impl Window {
    /// A window that keeps samples for `retention` (the longest window that will be asked for).
    pub fn new(retention: Duration) -> Self {
        Self {
            buckets: VecDeque::new(),
            retention,
        }
    }

    /// Keeps samples for `retention` from now on; a shorter one drops the older samples
    /// at the next record, a longer one keeps the present ones longer.
    pub fn set_retention(&mut self, retention: Duration) {
        self.retention = retention;
    }

    /// Records `value` at `now`. Samples earlier than the newest bucket are folded into it.
    pub fn record(&mut self, now: Duration, value: f64) {
        let index = now.as_millis() / BUCKET_MS;
        match self.buckets.back_mut() {
            Some(last) if last.index >= index => {
                last.sum += value;
                last.count += 1;
            }
            _ => self.buckets.push_back(Bucket {
                index,
                sum: value,
                count: 1,
            }),
        }
        let keep = self.retention.as_millis().div_ceil(BUCKET_MS);
        while self
            .buckets
            .front()
            .is_some_and(|b| b.index + keep <= index)
        {
            self.buckets.pop_front();
        }
    }

    /// Highest bucket average within `window` ending at `now`; `None` without samples.
    pub fn max(&self, now: Duration, window: Duration) -> Option<f64> {
        let index = now.as_millis() / BUCKET_MS;
        let span = window.as_millis().div_ceil(BUCKET_MS).max(1);
        self.buckets
            .iter()
            .filter(|b| b.index + span > index && b.index <= index)
            .map(|b| b.sum / f64::from(b.count))
            .reduce(f64::max)
    }

    /// Mean of the bucket averages within `window` ending at `now`; `None` without samples.
    pub fn average(&self, now: Duration, window: Duration) -> Option<f64> {
        let index = now.as_millis() / BUCKET_MS;
        let span = window.as_millis().div_ceil(BUCKET_MS).max(1);
        let (sum, n) = self
            .buckets
            .iter()
            .filter(|b| b.index + span > index && b.index <= index)
            .fold((0.0, 0u32), |(s, n), b| {
                (s + b.sum / f64::from(b.count), n + 1)
            });
        (n > 0).then(|| sum / f64::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn empty_window_has_no_average() {
        assert_eq!(Window::new(s(60)).average(s(10), s(60)), None);
    }

    #[test]
    fn averages_buckets_inside_the_window_only() {
        let mut w = Window::new(s(60));
        for t in 0..10 {
            w.record(s(t), t as f64);
        }
        // last 6 s: samples 4..=9
        assert_eq!(
            w.average(s(9), s(6)),
            Some((4..=9).sum::<u64>() as f64 / 6.0)
        );
        assert_eq!(w.average(s(9), s(60)), Some(4.5));
    }

    #[test]
    fn samples_in_one_bucket_are_averaged_not_summed() {
        let mut w = Window::new(s(60));
        w.record(Duration::from_millis(100), 2.0);
        w.record(Duration::from_millis(600), 4.0);
        w.record(s(1), 9.0);
        assert_eq!(w.average(s(1), s(60)), Some((3.0 + 9.0) / 2.0));
    }

    #[test]
    fn max_is_the_highest_bucket_in_the_window() {
        let mut w = Window::new(s(60));
        for (t, v) in [(0, 9.0), (10, 3.0), (20, 5.0)] {
            w.record(s(t), v);
        }
        assert_eq!(w.max(s(20), s(60)), Some(9.0));
        assert_eq!(w.max(s(20), s(15)), Some(5.0));
        assert_eq!(w.max(s(100), s(15)), None);
    }

    #[test]
    fn retention_drops_old_buckets() {
        let mut w = Window::new(s(5));
        for t in 0..100 {
            w.record(s(t), 1.0);
        }
        assert_eq!(w.buckets.len(), 5);
        assert_eq!(w.average(s(200), s(5)), None);
    }

    #[test]
    fn missed_ticks_do_not_bias_towards_zero() {
        let mut w = Window::new(s(60));
        w.record(s(0), 10.0);
        w.record(s(30), 10.0);
        assert_eq!(w.average(s(30), s(60)), Some(10.0));
    }
}
