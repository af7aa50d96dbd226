//! A small map whose entries are fresh for a fixed time (keys and tenant policies).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Sweep expired entries when the map grows past this.
const SWEEP_AT: usize = 4096;

/// Entries fresh for `ttl`; stale ones stay readable (as a fallback while the source of
/// truth is down) until swept.
#[derive(Debug)]
pub(crate) struct TtlCache<K, V> {
    ttl: Duration,
    map: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration) -> Self {
        TtlCache {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (V, Instant)>> {
        // Entries are written whole; a panic elsewhere cannot leave one half-written.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry if it is fresh.
    pub fn fresh(&self, k: &K) -> Option<V> {
        let map = self.lock();
        map.get(k)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(v, _)| v.clone())
    }

    /// The entry however old (a fallback).
    pub fn stale(&self, k: &K) -> Option<V> {
        self.lock().get(k).map(|(v, _)| v.clone())
    }

    pub fn put(&self, k: K, v: V) {
        let mut map = self.lock();
        if map.len() >= SWEEP_AT {
            let ttl = self.ttl;
            map.retain(|_, (_, at)| at.elapsed() < ttl);
        }
        map.insert(k, (v, Instant::now()));
    }

    pub fn remove(&self, k: &K) {
        self.lock().remove(k);
    }

    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_go_stale_after_ttl() {
        let c = TtlCache::new(Duration::from_secs(2));
        c.put("a", 1);
        assert_eq!(c.fresh(&"a"), Some(1));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(c.fresh(&"a"), None);
        assert_eq!(c.stale(&"a"), Some(1));
        c.remove(&"a");
        assert_eq!(c.stale(&"a"), None);
        c.put("b", 2);
        c.clear();
        assert_eq!(c.stale(&"b"), None);
    }
}
