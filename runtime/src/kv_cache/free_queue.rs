//! Free-block queue (vLLM v1 `kv_cache_utils.FreeKVCacheBlockQueue`).
//!
//! A doubly linked list threaded through two index arrays, so taking the front, appending,
//! and removing a block from the middle (a prefix hit on a free cached block) are all O(1)
//! without allocation. The front is evicted first: blocks are appended when freed, so the
//! order is least recently used first.

const NIL: u32 = u32::MAX;

/// Queue of free block ids in eviction order (front = next to hand out).
#[derive(Debug, Clone)]
pub(crate) struct FreeBlockQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding every block `0..num_blocks` in id order.
    /// `num_blocks` must be below `u32::MAX` (checked by the pool's config validation).
    pub(crate) fn new(num_blocks: usize) -> Self {
        let n = num_blocks as u32;
        let prev = (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        let next = (0..n)
            .map(|i| if i + 1 == n { NIL } else { i + 1 })
            .collect();
        Self {
            prev,
            next,
            in_queue: vec![true; num_blocks],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            len: num_blocks,
        }
    }

    /// Number of free blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `id` is in the queue.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.in_queue.get(id as usize).copied().unwrap_or(false)
    }

    /// Takes the block at the front (the least recently freed).
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let id = self.head;
        self.unlink(id);
        Some(id)
    }

    /// Appends `id` at the back (evicted last). No-op if it is already queued.
    pub(crate) fn push_back(&mut self, id: u32) {
        if !self.valid(id) || self.contains(id) {
            return;
        }
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Inserts `id` at the front (handed out next). No-op if it is already queued.
    pub(crate) fn push_front(&mut self, id: u32) {
        if !self.valid(id) || self.contains(id) {
            return;
        }
        let i = id as usize;
        self.next[i] = self.head;
        self.prev[i] = NIL;
        if self.head == NIL {
            self.tail = id;
        } else {
            self.prev[self.head as usize] = id;
        }
        self.head = id;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Removes `id` wherever it is; returns whether it was queued.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        self.unlink(id);
        true
    }

    /// Block ids from front to back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), move |&id| {
            let n = self.next[id as usize];
            (n != NIL).then_some(n)
        })
    }

    fn valid(&self, id: u32) -> bool {
        (id as usize) < self.in_queue.len()
    }

    fn unlink(&mut self, id: u32) {
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn items(q: &FreeBlockQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn starts_with_all_blocks_in_id_order() {
        let q = FreeBlockQueue::new(5);
        assert_eq!(items(&q), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.len(), 5);
        let mut empty = FreeBlockQueue::new(0);
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.pop_front(), None);
        assert!(!empty.contains(0));
    }

    #[test]
    fn pop_push_and_remove_keep_order() {
        let mut q = FreeBlockQueue::new(5);
        assert_eq!(q.pop_front(), Some(0));
        assert!(q.remove(2));
        assert!(!q.remove(2), "second removal is a no-op");
        q.push_back(0);
        q.push_front(2);
        assert_eq!(items(&q), vec![2, 1, 3, 4, 0]);
        q.push_back(0); // already queued: ignored
        q.push_back(99); // out of range: ignored
        assert_eq!(q.len(), 5);
        assert!(q.remove(0) && q.remove(2));
        assert_eq!(items(&q), vec![1, 3, 4]);
        while q.pop_front().is_some() {}
        assert_eq!(q.len(), 0);
        q.push_back(4);
        assert_eq!(items(&q), vec![4]);
    }

    #[test]
    fn matches_a_reference_deque_under_random_operations() {
        // Exhaustive-ish: a seeded stream of operations checked against VecDeque.
        let n = 12u32;
        let mut q = FreeBlockQueue::new(n as usize);
        let mut reference: VecDeque<u32> = (0..n).collect();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let id = (state % u64::from(n)) as u32;
            match (state >> 32) % 4 {
                0 => assert_eq!(q.pop_front(), reference.pop_front()),
                1 => {
                    q.push_back(id);
                    if !reference.contains(&id) {
                        reference.push_back(id);
                    }
                }
                2 => {
                    q.push_front(id);
                    if !reference.contains(&id) {
                        reference.push_front(id);
                    }
                }
                _ => {
                    let was = reference.iter().position(|&x| x == id);
                    if let Some(pos) = was {
                        reference.remove(pos);
                    }
                    assert_eq!(q.remove(id), was.is_some());
                }
            }
            assert_eq!(q.len(), reference.len());
            assert_eq!(items(&q), reference.iter().copied().collect::<Vec<_>>());
            for b in 0..n {
                assert_eq!(q.contains(b), reference.contains(&b));
            }
        }
    }
}
