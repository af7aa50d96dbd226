//! Caches of what the ledger and the broker said: fresh for `ttl`, and usable as a fallback
//! while the ledger cannot be asked for at most `max_stale` after the check that filled them.
//!
//! [`KeyCache`] adds what a key cache needs to never fail open: a key the ledger refused is
//! forgotten at once, and a check that began before that refusal (or before a revocation
//! through this gateway) cannot put the key back.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tidal_billing::Principal;
use tokio::time::Instant;

/// Sweep expired entries when the map grows past this.
const SWEEP_AT: usize = 4096;

/// Entries fresh for `ttl`, then usable as a fallback until `max_stale` after they were
/// put, then gone.
#[derive(Debug)]
pub(crate) struct TtlCache<K, V> {
    ttl: Duration,
    max_stale: Duration,
    map: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// A cache whose entries are fresh for `ttl` and a fallback until `max_stale`.
    pub fn new(ttl: Duration, max_stale: Duration) -> Self {
        TtlCache {
            ttl,
            max_stale: max_stale.max(ttl),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (V, Instant)>> {
        // Entries are written whole; a panic elsewhere cannot leave one half-written.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn within(&self, k: &K, age: Duration) -> Option<V> {
        self.lock()
            .get(k)
            .filter(|(_, at)| at.elapsed() < age)
            .map(|(v, _)| v.clone())
    }

    /// The entry if it is fresh.
    pub fn fresh(&self, k: &K) -> Option<V> {
        self.within(k, self.ttl)
    }

    /// The entry if it is younger than `max_stale` (the fallback while the source of truth
    /// cannot be asked).
    pub fn stale(&self, k: &K) -> Option<V> {
        self.within(k, self.max_stale)
    }

    /// Stores `v`, checked now.
    pub fn put(&self, k: K, v: V) {
        let mut map = self.lock();
        if map.len() >= SWEEP_AT {
            let keep = self.max_stale;
            map.retain(|_, (_, at)| at.elapsed() < keep);
        }
        map.insert(k, (v, Instant::now()));
    }

    /// Forgets `k`.
    pub fn remove(&self, k: &K) {
        self.lock().remove(k);
    }
}

/// Digest of a presented API key (SHA-256 of the secret).
pub(crate) type KeyDigest = [u8; 32];

/// What the cache knows of one presented key.
#[derive(Debug, Default)]
struct Slot {
    /// The principal and when the check that found it valid began.
    valid: Option<(Principal, Instant)>,
    /// The ledger refused this key while checks were in flight: none of them may record it.
    refused: bool,
    /// Ledger checks of this key in flight.
    checks: u32,
}

#[derive(Debug, Default)]
struct Keys {
    slots: HashMap<KeyDigest, Slot>,
    /// Bumped by each revocation through this gateway: checks begun before it may not
    /// record what they find.
    epoch: u64,
}

/// Verified API keys, by [`KeyDigest`].
///
/// A key is served from here when its last successful check began less than `ttl` ago
/// (fresh) or, while the ledger cannot be asked, less than `max_stale` ago. Once the ledger
/// refuses a key (unknown or revoked) the entry is gone, and checks that were in flight
/// then cannot bring it back, so a revocation seen once is final; revocations through this
/// gateway ([`KeyCache::revoke`]) are final the same way.
#[derive(Debug)]
pub(crate) struct KeyCache {
    ttl: Duration,
    max_stale: Duration,
    keys: Mutex<Keys>,
}

/// A ledger check of one key in flight ([`KeyCache::begin`]); record its outcome with
/// [`Check::valid`] or [`Check::refused`]. Dropping it records nothing.
#[must_use]
#[derive(Debug)]
pub(crate) struct Check<'a> {
    cache: &'a KeyCache,
    digest: KeyDigest,
    epoch: u64,
    started: Instant,
}

impl KeyCache {
    /// A cache whose entries are fresh for `ttl` and a fallback until `max_stale`.
    pub fn new(ttl: Duration, max_stale: Duration) -> Self {
        KeyCache {
            ttl,
            max_stale: max_stale.max(ttl),
            keys: Mutex::new(Keys::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        // Slots are written whole; a panic elsewhere cannot leave one half-written.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn within(&self, d: &KeyDigest, age: Duration) -> Option<Principal> {
        let keys = self.lock();
        let (p, at) = keys.slots.get(d)?.valid.as_ref()?;
        (at.elapsed() < age).then(|| p.clone())
    }

    /// The key's principal if its last check is fresh.
    pub fn fresh(&self, d: &KeyDigest) -> Option<Principal> {
        self.within(d, self.ttl)
    }

    /// The key's principal if its last check is younger than `max_stale` (the fallback
    /// while the ledger cannot be asked).
    pub fn stale(&self, d: &KeyDigest) -> Option<Principal> {
        self.within(d, self.max_stale)
    }

    /// Registers a ledger check of `d` starting now.
    pub fn begin(&self, d: KeyDigest) -> Check<'_> {
        let mut keys = self.lock();
        let epoch = keys.epoch;
        keys.slots.entry(d).or_default().checks += 1;
        Check {
            cache: self,
            digest: d,
            epoch,
            started: Instant::now(),
        }
    }

    /// A key was revoked through this gateway: forget it, and refuse what checks already in
    /// flight would record (they may have read the ledger before the revocation).
    pub fn revoke(&self, key_id: &str) {
        let mut keys = self.lock();
        keys.epoch += 1;
        keys.slots.retain(|_, s| {
            if s.valid.as_ref().is_some_and(|(p, _)| p.key_id == key_id) {
                s.valid = None;
            }
            s.valid.is_some() || s.checks > 0
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

impl Check<'_> {
    /// The ledger accepted the key: remember it, unless it was refused or a key was revoked
    /// here since this check began.
    pub fn valid(self, p: Principal) {
        let mut keys = self.cache.lock();
        let current = keys.epoch == self.epoch;
        if keys.slots.len() >= SWEEP_AT {
            let keep = self.cache.max_stale;
            keys.slots.retain(|_, s| {
                s.checks > 0 || s.valid.as_ref().is_some_and(|(_, at)| at.elapsed() < keep)
            });
        }
        if let Some(slot) = keys.slots.get_mut(&self.digest) {
            let newer = slot
                .valid
                .as_ref()
                .is_some_and(|(_, at)| *at > self.started);
            if current && !slot.refused && !newer {
                slot.valid = Some((p, self.started));
            }
        }
    }

    /// The ledger refused the key (unknown or revoked): forget it for good.
    pub fn refused(self) {
        let mut keys = self.cache.lock();
        if let Some(slot) = keys.slots.get_mut(&self.digest) {
            slot.valid = None;
            slot.refused = true;
        }
    }
}

impl Drop for Check<'_> {
    fn drop(&mut self) {
        let mut keys = self.cache.lock();
        if let Some(slot) = keys.slots.get_mut(&self.digest) {
            slot.checks = slot.checks.saturating_sub(1);
            // With no check in flight, a refusal needs no memory: any later check reads the
            // ledger after it and is refused too.
            if slot.checks == 0 && (slot.refused || slot.valid.is_none()) {
                keys.slots.remove(&self.digest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidal_billing::Role;

    const TTL: Duration = Duration::from_secs(2);
    const STALE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn entries_are_fresh_then_stale_then_gone() {
        let c = TtlCache::new(TTL, STALE);
        c.put("a", 1);
        assert_eq!(c.fresh(&"a"), Some(1));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(c.fresh(&"a"), None);
        assert_eq!(c.stale(&"a"), Some(1));
        tokio::time::advance(STALE).await;
        assert_eq!(c.stale(&"a"), None, "no fallback past max_stale");
        c.put("b", 2);
        c.remove(&"b");
        assert_eq!(c.stale(&"b"), None);
    }

    fn principal(key_id: &str) -> Principal {
        Principal {
            key_id: key_id.into(),
            tenant: "acme".into(),
            role: Role::Tenant,
        }
    }

    const A: KeyDigest = [1; 32];
    const B: KeyDigest = [2; 32];

    #[tokio::test(start_paused = true)]
    async fn a_verified_key_is_fresh_then_a_bounded_fallback() {
        let c = KeyCache::new(TTL, STALE);
        c.begin(A).valid(principal("k1"));
        assert_eq!(c.fresh(&A), Some(principal("k1")));
        tokio::time::advance(TTL).await;
        assert_eq!(c.fresh(&A), None);
        assert_eq!(c.stale(&A), Some(principal("k1")));
        tokio::time::advance(STALE - TTL).await;
        assert_eq!(c.stale(&A), None, "not past max_stale after the last check");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_removes_the_fallback() {
        let c = KeyCache::new(TTL, STALE);
        c.begin(A).valid(principal("k1"));
        tokio::time::advance(TTL).await;
        c.begin(A).refused();
        assert_eq!(c.stale(&A), None, "a refused key is never served again");
        assert_eq!(c.len(), 0, "and leaves nothing behind");
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_begun_before_a_refusal_cannot_restore_the_key() {
        let c = KeyCache::new(TTL, STALE);
        let early = c.begin(A);
        c.begin(A).refused();
        early.valid(principal("k1"));
        assert_eq!(c.stale(&A), None);
        assert_eq!(c.len(), 0);
        // Checks begun after the refusal are not affected (they read the ledger after it).
        c.begin(A).valid(principal("k1"));
        assert_eq!(c.fresh(&A), Some(principal("k1")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_revocation_here_is_final_for_checks_in_flight() {
        let c = KeyCache::new(TTL, STALE);
        c.begin(A).valid(principal("k1"));
        c.begin(B).valid(principal("k2"));
        let in_flight = c.begin(A);
        c.revoke("k1");
        assert_eq!(c.stale(&A), None);
        assert_eq!(c.fresh(&B), Some(principal("k2")), "other keys stay");
        in_flight.valid(principal("k1"));
        assert_eq!(c.stale(&A), None);
        assert_eq!(c.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_check_does_not_overwrite_a_newer_one() {
        let c = KeyCache::new(TTL, STALE);
        let old = c.begin(A);
        tokio::time::advance(TTL).await;
        c.begin(A).valid(principal("k1"));
        old.valid(principal("k1"));
        assert_eq!(
            c.fresh(&A),
            Some(principal("k1")),
            "timestamp of the newer check"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_keys_leave_nothing_behind() {
        let c = KeyCache::new(TTL, STALE);
        for i in 0..100u8 {
            c.begin([i; 32]).refused();
            drop(c.begin([i; 32]));
        }
        assert_eq!(c.len(), 0);
    }
}
