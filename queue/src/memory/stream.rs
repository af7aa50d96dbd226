//! An in-process stream with one consumer group: the subset of Redis Streams semantics the
//! broker uses (XADD ids, XREADGROUP `>`, pending entries list, XAUTOCLAIM, XACK, XDEL).

use std::collections::BTreeMap;
use std::fmt;

/// A stream entry id `<ms>-<seq>`, ordered like Redis's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    /// Parses `<ms>-<seq>`.
    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, seq) = s.split_once('-')?;
        Some(StreamId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A delivered, unacked entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    pub consumer: String,
    pub delivered_ms: u64,
    pub count: u32,
    /// Its holder has delivered the job's first token (the broker's decoding mark).
    pub decoding: bool,
}

/// Entries plus one consumer group.
#[derive(Debug)]
pub(crate) struct GroupStream<T> {
    entries: BTreeMap<StreamId, T>,
    last_id: StreamId,
    last_delivered: StreamId,
    pending: BTreeMap<StreamId, Pending>,
}

impl<T> Default for GroupStream<T> {
    fn default() -> Self {
        GroupStream {
            entries: BTreeMap::new(),
            last_id: StreamId::default(),
            last_delivered: StreamId::default(),
            pending: BTreeMap::new(),
        }
    }
}

impl<T: Clone> GroupStream<T> {
    /// Appends with an id after every earlier one (`XADD *`), even if the clock went back.
    pub fn add(&mut self, now_ms: u64, value: T) -> StreamId {
        let id = if now_ms > self.last_id.ms {
            StreamId { ms: now_ms, seq: 0 }
        } else {
            StreamId {
                ms: self.last_id.ms,
                seq: self.last_id.seq + 1,
            }
        };
        self.last_id = id;
        self.entries.insert(id, value);
        id
    }

    /// Delivers up to `max` never-delivered entries to `consumer` (`XREADGROUP ... >`).
    pub fn read_new(&mut self, consumer: &str, max: usize, now_ms: u64) -> Vec<(StreamId, T)> {
        let after = self.last_delivered;
        let picked: Vec<(StreamId, T)> = self
            .entries
            .range(after..)
            .filter(|(id, _)| **id > after)
            .take(max)
            .map(|(id, v)| (*id, v.clone()))
            .collect();
        for (id, _) in &picked {
            self.last_delivered = *id;
            self.pending.insert(
                *id,
                Pending {
                    consumer: consumer.to_owned(),
                    delivered_ms: now_ms,
                    count: 1,
                    decoding: false,
                },
            );
        }
        picked
    }

    /// Whether `consumer` has an entry pending.
    pub fn holds_any(&self, consumer: &str) -> bool {
        self.pending.values().any(|p| p.consumer == consumer)
    }

    /// Up to `max` entries pending for `consumer`, oldest first (`XREADGROUP ... 0`).
    pub fn own_pending(&self, consumer: &str, max: usize) -> Vec<(StreamId, T)> {
        self.pending
            .iter()
            .filter(|(_, p)| p.consumer == consumer)
            .filter_map(|(id, _)| self.entries.get(id).map(|v| (*id, v.clone())))
            .take(max)
            .collect()
    }

    /// Moves up to `max` entries idle for at least `min_idle_ms` to `consumer`, raising their
    /// delivery count (`XAUTOCLAIM`); pending ids whose entry was deleted are dropped.
    pub fn auto_claim(
        &mut self,
        consumer: &str,
        min_idle_ms: u64,
        max: usize,
        now_ms: u64,
    ) -> Vec<(StreamId, T, u32)> {
        self.claim_where(consumer, max, now_ms, |p| {
            now_ms.saturating_sub(p.delivered_ms) >= min_idle_ms
        })
    }

    /// Moves up to `max` entries pending for one of `holders` (never `consumer` itself) to
    /// `consumer`, whatever their idle time, raising their delivery count (`XCLAIM`).
    pub fn claim_from(
        &mut self,
        holders: &[String],
        consumer: &str,
        max: usize,
        now_ms: u64,
    ) -> Vec<(StreamId, T, u32)> {
        self.claim_where(consumer, max, now_ms, |p| {
            p.consumer != consumer && holders.contains(&p.consumer)
        })
    }

    /// Moves up to `max` pending entries that `take` picks to `consumer`.
    fn claim_where(
        &mut self,
        consumer: &str,
        max: usize,
        now_ms: u64,
        take: impl Fn(&Pending) -> bool,
    ) -> Vec<(StreamId, T, u32)> {
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, p) in self.pending.iter_mut() {
            if out.len() >= max {
                break;
            }
            if !take(p) {
                continue;
            }
            match self.entries.get(id) {
                Some(v) => {
                    p.consumer = consumer.to_owned();
                    p.delivered_ms = now_ms;
                    p.count += 1;
                    p.decoding = false;
                    out.push((*id, v.clone(), p.count));
                }
                None => gone.push(*id),
            }
        }
        for id in gone {
            self.pending.remove(&id);
        }
        out
    }

    /// Restarts the idle time of `id` if it is pending for `consumer` (`XCLAIM ... JUSTID` by
    /// its holder); whether it was.
    pub fn touch(&mut self, id: StreamId, consumer: &str, now_ms: u64) -> bool {
        match self.pending.get_mut(&id) {
            Some(p) if p.consumer == consumer && self.entries.contains_key(&id) => {
                p.delivered_ms = now_ms;
                true
            }
            _ => false,
        }
    }

    /// The pending record of `id`.
    pub fn pending(&self, id: StreamId) -> Option<&Pending> {
        self.pending.get(&id)
    }

    /// Marks pending `id` as decoding (nothing when it is not pending).
    pub fn mark_decoding(&mut self, id: StreamId) {
        if let Some(p) = self.pending.get_mut(&id) {
            p.decoding = true;
        }
    }

    /// Pending entries marked decoding.
    pub fn decoding_len(&self) -> u64 {
        self.pending.values().filter(|p| p.decoding).count() as u64
    }

    /// `XACK`: whether it was pending.
    pub fn ack(&mut self, id: StreamId) -> bool {
        self.pending.remove(&id).is_some()
    }

    /// `XDEL`: whether it existed.
    pub fn delete(&mut self, id: StreamId) -> bool {
        self.entries.remove(&id).is_some()
    }

    /// Entries never delivered, and the id of the oldest of them.
    pub fn backlog(&self) -> (u64, Option<StreamId>) {
        let after = self.last_delivered;
        let mut it = self.entries.range(after..).filter(|(id, _)| **id > after);
        let first = it.next().map(|(id, _)| *id);
        let n = first.map_or(0, |_| 1 + it.count() as u64);
        (n, first)
    }

    /// Number of pending entries.
    pub fn pending_len(&self) -> u64 {
        self.pending.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print() {
        let id = StreamId { ms: 17, seq: 3 };
        assert_eq!(id.to_string(), "17-3");
        assert_eq!(StreamId::parse("17-3"), Some(id));
        assert_eq!(StreamId::parse("17"), None);
        assert_eq!(StreamId::parse("a-1"), None);
    }

    #[test]
    fn ids_increase_even_when_the_clock_goes_back() {
        let mut s = GroupStream::default();
        let a = s.add(100, 'a');
        let b = s.add(100, 'b');
        let c = s.add(50, 'c');
        let d = s.add(200, 'd');
        assert!(a < b && b < c && c < d);
        assert_eq!(c, StreamId { ms: 100, seq: 2 });
        assert_eq!(d, StreamId { ms: 200, seq: 0 });
    }

    #[test]
    fn read_new_delivers_each_entry_once_in_order() {
        let mut s = GroupStream::default();
        for (t, v) in [(1, 'a'), (2, 'b'), (3, 'c')] {
            s.add(t, v);
        }
        let first: Vec<char> = s.read_new("x", 2, 10).into_iter().map(|e| e.1).collect();
        let second: Vec<char> = s.read_new("y", 5, 10).into_iter().map(|e| e.1).collect();
        assert_eq!(first, vec!['a', 'b']);
        assert_eq!(second, vec!['c']);
        assert!(s.read_new("x", 5, 10).is_empty());
        assert_eq!(s.pending_len(), 3);
        assert_eq!(s.backlog(), (0, None));
    }

    #[test]
    fn backlog_counts_undelivered_and_skips_deleted() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        let b = s.add(2, 'b');
        s.add(3, 'c');
        assert_eq!(s.backlog(), (3, Some(a)));
        s.delete(a);
        assert_eq!(s.backlog(), (2, Some(b)));
        s.read_new("x", 1, 5);
        assert_eq!(s.backlog().0, 1);
    }

    #[test]
    fn auto_claim_respects_idle_time_and_counts_deliveries() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        s.read_new("dead", 1, 100);
        assert!(s.auto_claim("live", 50, 10, 149).is_empty());
        let got = s.auto_claim("live", 50, 10, 150);
        assert_eq!(got, vec![(a, 'a', 2)]);
        assert_eq!(s.pending(a).map(|p| p.consumer.as_str()), Some("live"));
        // Just delivered again: not idle.
        assert!(s.auto_claim("other", 50, 10, 160).is_empty());
    }

    #[test]
    fn claim_from_takes_only_the_named_holders_entries() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        let b = s.add(2, 'b');
        let c = s.add(3, 'c');
        s.read_new("dead", 2, 100);
        s.read_new("live", 1, 100);
        let dead = ["dead".to_owned(), "live".to_owned()];
        // Not idle at all, yet taken; the taker's own entry is never "taken" from itself.
        assert_eq!(
            s.claim_from(&dead, "live", 10, 101),
            vec![(a, 'a', 2), (b, 'b', 2)]
        );
        assert_eq!(s.pending(c).map(|p| p.count), Some(1));
        assert!(s.claim_from(&dead[..1], "other", 10, 102).is_empty());
    }

    #[test]
    fn touch_restarts_idle_time_for_the_holder_only() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        s.read_new("w", 1, 100);
        assert!(!s.touch(a, "other", 140));
        assert!(s.touch(a, "w", 140));
        assert!(s.auto_claim("live", 50, 10, 180).is_empty());
        assert_eq!(s.auto_claim("live", 50, 10, 190), vec![(a, 'a', 2)]);
        assert!(!s.touch(a, "w", 200));
    }

    #[test]
    fn auto_claim_drops_deleted_pending_entries() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        s.read_new("dead", 1, 1);
        s.delete(a);
        assert!(s.auto_claim("live", 0, 10, 100).is_empty());
        assert_eq!(s.pending_len(), 0);
    }

    #[test]
    fn ack_and_own_pending() {
        let mut s = GroupStream::default();
        let a = s.add(1, 'a');
        let b = s.add(2, 'b');
        s.read_new("x", 1, 1);
        s.read_new("y", 1, 1);
        assert_eq!(s.own_pending("x", 10), vec![(a, 'a')]);
        assert_eq!(s.own_pending("y", 10), vec![(b, 'b')]);
        assert!(s.ack(a));
        assert!(!s.ack(a));
        assert!(s.own_pending("x", 10).is_empty());
        assert!(s.delete(b));
        assert!(s.own_pending("y", 10).is_empty());
    }
}
