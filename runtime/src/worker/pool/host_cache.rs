//! The host cache of unloaded models. A GGUF file is memory-mapped to load it, so its bytes
//! live in the kernel's page cache: a model is "in the host cache" (warm) while its file's
//! pages are resident there, and loading it again reads memory instead of disk. The kernel
//! evicts such pages by itself under memory pressure; with `--host-cache-bytes` the worker
//! also bounds what unloaded models keep resident: past the bound, the least recently
//! unloaded ones are dropped from the page cache (`posix_fadvise(DONTNEED)`), so the node's
//! memory goes to the models that are likelier to come back. They stay on local disk (a
//! load from disk, still no download).

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Fraction of a file's pages that must be resident for it to count as warm.
const WARM_FRACTION: f64 = 0.9;

/// The share of `path`'s pages resident in the page cache (0 to 1), by `mincore` on a
/// fresh read-only mapping (which reads nothing). `None` when the file cannot be mapped.
pub fn resident_fraction(path: &Path) -> Option<f64> {
    let file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len() as usize;
    if len == 0 {
        return Some(1.0);
    }
    // SAFETY: a read-only shared mapping that is only passed to mincore, never read; a file
    // truncated meanwhile cannot fault us.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let page = page_size();
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    let resident = vec.iter().filter(|b| **b & 1 == 1).count();
    Some(resident as f64 / pages as f64)
}

/// Whether `path` is warm ([`WARM_FRACTION`] of its pages resident).
pub fn is_warm(path: &Path) -> bool {
    resident_fraction(path).is_some_and(|f| f >= WARM_FRACTION)
}

/// Asks the kernel to drop `path`'s pages from the page cache (pages mapped by a running
/// process stay). Needs no privilege.
pub fn evict(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    // SAFETY: a plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Serves every allocation of at least `bytes` from its own mapping (glibc's
/// `M_MMAP_THRESHOLD`; other C libraries are left alone). glibc raises that threshold after
/// a large block is freed, so after an unload a model's next KV cache would come from the
/// heap, which must be zeroed page by page (a quarter of a second per GiB on a small CPU),
/// and its memory would stay in the process after the next unload. A fixed threshold keeps
/// large blocks on fresh zero pages, returned to the system when freed. Process-wide.
pub fn keep_large_allocations_mapped(bytes: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes the allocator's tuning.
        if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) } != 1 {
            tracing::warn!("cannot set the allocator's mmap threshold");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|n| *n > 0).unwrap_or(4096)
}

/// Unloaded models by recency, with what they may keep in the page cache.
#[derive(Debug)]
pub struct HostCache {
    /// Bytes unloaded models may keep resident; `None`: as the kernel decides.
    limit: Option<u64>,
    /// Most recently unloaded last: (model, file, bytes).
    lru: VecDeque<(String, PathBuf, u64)>,
}

impl HostCache {
    /// A cache bounded to `limit` bytes (`None`: unbounded).
    pub fn new(limit: Option<u64>) -> Self {
        HostCache {
            limit,
            lru: VecDeque::new(),
        }
    }

    /// `model` was loaded: its pages are the engine's now, outside the cache's bound.
    pub fn loaded(&mut self, model: &str) {
        self.lru.retain(|(m, _, _)| m != model);
    }

    /// `model` was unloaded; returns the files evicted to stay within the bound (least
    /// recently unloaded first), already dropped from the page cache.
    pub fn unloaded(&mut self, model: &str, path: PathBuf, bytes: u64) -> Vec<String> {
        self.loaded(model);
        self.lru.push_back((model.to_owned(), path, bytes));
        let Some(limit) = self.limit else {
            return Vec::new();
        };
        let mut evicted = Vec::new();
        while self.lru.iter().map(|(_, _, b)| b).sum::<u64>() > limit {
            let Some((m, p, _)) = self.lru.pop_front() else {
                break;
            };
            if let Err(e) = evict(&p) {
                tracing::warn!(model = %m, error = %e, "cannot drop the file from the page cache");
            }
            tracing::info!(model = %m, "dropped from the host cache (least recently used)");
            evicted.push(m);
        }
        evicted
    }

    /// Unloaded models in the cache, most recent first.
    pub fn recent(&self) -> Vec<String> {
        self.lru.iter().rev().map(|(m, _, _)| m.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_unloaded_go_first() {
        let d = tempfile::tempdir().unwrap();
        let file = |n: &str| {
            let p = d.path().join(n);
            std::fs::write(&p, vec![1u8; 8192]).unwrap();
            p
        };
        let mut c = HostCache::new(Some(250));
        assert!(c.unloaded("a", file("a"), 100).is_empty());
        assert!(c.unloaded("b", file("b"), 100).is_empty());
        assert_eq!(c.unloaded("c", file("c"), 100), ["a"]);
        c.loaded("b");
        assert_eq!(c.recent(), ["c"]);
        let mut open = HostCache::new(None);
        assert!(open.unloaded("a", file("a"), u64::MAX).is_empty());
    }

    #[test]
    fn residency_is_measured() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        let f = resident_fraction(&p).unwrap();
        assert!((0.0..=1.0).contains(&f));
        // Just written pages are usually resident, but tmpfs or dirty pages may stay; only
        // check the calls work.
        evict(&p).unwrap();
        assert!(resident_fraction(&p).is_some());
    }
}
