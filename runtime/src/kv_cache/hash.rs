//! Block hash chain for prefix caching (vLLM v1 `kv_cache_utils.hash_block_tokens`).
//!
//! A full block's identity is `H(parent identity, block tokens)`, so two sequences share a
//! block's name only when their whole prefix up to and including that block is equal. The
//! hash is 64-bit FNV-1a: fixed, seedless and the same on every machine and run, so cache
//! identities are reproducible. Collisions are harmless: the pool compares contents on lookup.
//!
//! A [`CacheScope`] keeps tenants apart (vLLM's `cache_salt`): the first block of a salted
//! sequence that is not part of its public shared prefix is hashed with the salt, and every
//! later block inherits it through the chain, so sequences of different scopes never share a
//! block after that point, even for identical tokens.

use std::sync::Arc;

/// Which prefix-cache blocks a sequence may share with others.
///
/// The default scope has no salt: every unsalted sequence shares with every other (the
/// direct server, which has no tenants). A salted scope (the queue worker salts with the
/// job's tenant) shares only with sequences of the same salt, except for the blocks lying
/// wholly inside its first `shared_tokens` tokens: those are the operator's public shared
/// prefix (a system prompt every tenant sends), hashed without the salt so every scope
/// reuses them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheScope {
    salt: Option<Arc<str>>,
    shared_tokens: usize,
}

impl CacheScope {
    /// The unsalted scope, shared by every sequence without a salt.
    pub const fn unsalted() -> Self {
        CacheScope {
            salt: None,
            shared_tokens: 0,
        }
    }

    /// The scope of `salt`: no block is shared with another salt (or with unsalted
    /// sequences).
    pub fn salted(salt: impl Into<Arc<str>>) -> Self {
        CacheScope {
            salt: Some(salt.into()),
            shared_tokens: 0,
        }
    }

    /// This scope, except that the blocks wholly inside the sequence's first `tokens` tokens
    /// (a public shared prefix the sequence starts with) are hashed without the salt.
    pub fn with_shared_prefix(mut self, tokens: usize) -> Self {
        self.shared_tokens = tokens;
        self
    }

    /// The salt, if any.
    pub fn salt(&self) -> Option<&str> {
        self.salt.as_deref()
    }

    /// Leading tokens hashed without the salt.
    pub fn shared_tokens(&self) -> usize {
        self.shared_tokens
    }

    /// The salt that block `index` is hashed with (blocks of `block_size` tokens): only the
    /// first block past the shared prefix takes it; the chain carries it on from there.
    pub fn salt_of_block(&self, index: usize, block_size: usize) -> Option<&str> {
        let first_salted = self.shared_tokens / block_size.max(1);
        self.salt.as_deref().filter(|_| index == first_salted)
    }
}

/// Identity of a full block of tokens in the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Folds `bytes` into a running 64-bit FNV-1a state.
fn fnv1a_extend(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a_extend(FNV_OFFSET_BASIS, bytes)
}

/// Hash of one block given its parent's hash (`None` for the first block of a sequence).
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    hash_salted_block(parent, None, tokens)
}

/// Hash of one block given its parent's hash and the salt it introduces into the chain
/// (see [`CacheScope::salt_of_block`]); without a salt, [`hash_block`].
pub fn hash_salted_block(
    parent: Option<BlockHash>,
    salt: Option<&str>,
    tokens: &[u32],
) -> BlockHash {
    // A tag byte keeps "no parent" distinct from any parent hash value, and salted blocks
    // distinct from unsalted ones.
    let tag = u8::from(parent.is_some()) | if salt.is_some() { 2 } else { 0 };
    let mut h = fnv1a_extend(FNV_OFFSET_BASIS, &[tag]);
    if let Some(p) = parent {
        h = fnv1a_extend(h, &p.0.to_le_bytes());
    }
    if let Some(salt) = salt {
        // Length-prefixed, so salt bytes can never be read as tokens.
        h = fnv1a_extend(h, &(salt.len() as u64).to_le_bytes());
        h = fnv1a_extend(h, salt.as_bytes());
    }
    // The length keeps blocks of different sizes apart.
    h = fnv1a_extend(h, &(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h = fnv1a_extend(h, &t.to_le_bytes());
    }
    BlockHash(h)
}

/// Extends `hashes` (the chain of the first `hashes.len()` full blocks of `tokens` in
/// `scope`) with the hashes of every further full block of `tokens`.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    scope: &CacheScope,
) {
    if block_size == 0 {
        return;
    }
    let full_blocks = tokens.len() / block_size;
    for (i, chunk) in tokens
        .chunks_exact(block_size)
        .enumerate()
        .take(full_blocks)
        .skip(hashes.len())
    {
        let parent = i.checked_sub(1).and_then(|j| hashes.get(j).copied());
        hashes.push(hash_salted_block(
            parent,
            scope.salt_of_block(i, block_size),
            chunk,
        ));
    }
}

/// Hashes of every full block of `tokens` in the unsalted scope.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    scoped_block_hashes(tokens, block_size, &CacheScope::unsalted())
}

/// Hashes of every full block of `tokens` in `scope`.
pub fn scoped_block_hashes(
    tokens: &[u32],
    block_size: usize,
    scope: &CacheScope,
) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend_block_hashes(&mut hashes, tokens, block_size, scope);
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        // Vectors from the FNV reference test suite (Fowler/Noll/Vo).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_is_a_pure_function_of_parent_and_tokens() {
        let a = hash_block(None, &[1, 2, 3, 4]);
        assert_eq!(a, hash_block(None, &[1, 2, 3, 4]));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5]));
        assert_ne!(a, hash_block(None, &[4, 3, 2, 1]));
        assert_ne!(a, hash_block(Some(BlockHash(0)), &[1, 2, 3, 4]));
        let b = hash_block(Some(a), &[5, 6, 7, 8]);
        assert_eq!(b, hash_block(Some(a), &[5, 6, 7, 8]));
        assert_ne!(b, hash_block(None, &[5, 6, 7, 8]));
        assert_ne!(b, hash_block(Some(BlockHash(a.0 ^ 1)), &[5, 6, 7, 8]));
    }

    #[test]
    fn hash_has_a_fixed_value_across_runs() {
        // Pinned so an accidental change of hasher or byte layout is caught: prefix-cache
        // identities must not depend on process, seed or platform.
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(&7u32.to_le_bytes());
        bytes.extend_from_slice(&9u32.to_le_bytes());
        assert_eq!(hash_block(None, &[7, 9]).0, fnv1a64(&bytes));
        assert_eq!(hash_block(None, &[7, 9]).0, 0xf333_181a_2f87_60c3);
    }

    #[test]
    fn chain_identity_depends_on_the_whole_prefix() {
        let x = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        let y = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4);
        let z = block_hashes(&[0, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_eq!(x.len(), 2, "partial block is not hashed");
        assert_eq!(x, y);
        assert_ne!(x[0], z[0]);
        assert_ne!(
            x[1], z[1],
            "same block tokens under a different parent differ"
        );
        assert_eq!(x[1], hash_block(Some(x[0]), &[5, 6, 7, 8]));
    }

    #[test]
    fn salted_chains_share_nothing_with_other_salts() {
        let tokens: Vec<u32> = (0..20).collect();
        let plain = block_hashes(&tokens, 4);
        let a = scoped_block_hashes(&tokens, 4, &CacheScope::salted("tenant-a"));
        let b = scoped_block_hashes(&tokens, 4, &CacheScope::salted("tenant-b"));
        let empty = scoped_block_hashes(&tokens, 4, &CacheScope::salted(""));
        assert_eq!(
            a,
            scoped_block_hashes(&tokens, 4, &CacheScope::salted("tenant-a"))
        );
        for i in 0..plain.len() {
            let row = [plain[i], a[i], b[i], empty[i]];
            for (x, hx) in row.iter().enumerate() {
                for hy in &row[x + 1..] {
                    assert_ne!(hx, hy, "block {i}");
                }
            }
        }
        // The salt is length-prefixed: moving bytes between salt and tokens changes the hash.
        assert_ne!(
            hash_salted_block(None, Some("ab"), &[1]),
            hash_salted_block(None, Some("a"), &[1])
        );
    }

    #[test]
    fn blocks_inside_the_shared_prefix_are_unsalted() {
        let tokens: Vec<u32> = (0..20).collect();
        let plain = block_hashes(&tokens, 4);
        // 10 shared tokens: blocks 0 and 1 lie wholly inside them, block 2 straddles the end.
        let a = scoped_block_hashes(&tokens, 4, &CacheScope::salted("a").with_shared_prefix(10));
        let b = scoped_block_hashes(&tokens, 4, &CacheScope::salted("b").with_shared_prefix(10));
        assert_eq!(a[..2], plain[..2]);
        assert_eq!(b[..2], plain[..2]);
        for i in 2..plain.len() {
            assert_ne!(a[i], plain[i], "block {i}");
            assert_ne!(a[i], b[i], "block {i}");
        }
        assert_eq!(
            a[2],
            hash_salted_block(Some(plain[1]), Some("a"), &tokens[8..12])
        );
        assert_eq!(a[3], hash_block(Some(a[2]), &tokens[12..16]));
        // A shared prefix covering every block leaves the chain unsalted.
        let all = CacheScope::salted("a").with_shared_prefix(20);
        assert_eq!(scoped_block_hashes(&tokens, 4, &all), plain);
    }

    #[test]
    fn extending_incrementally_equals_hashing_at_once() {
        let tokens: Vec<u32> = (0..50).map(|i| i * 7 % 13).collect();
        let mut inc = Vec::new();
        let scope = CacheScope::salted("acme").with_shared_prefix(12);
        let mut salted = Vec::new();
        for end in 0..=tokens.len() {
            extend_block_hashes(&mut inc, &tokens[..end], 5, &CacheScope::unsalted());
            assert_eq!(inc, block_hashes(&tokens[..end], 5));
            extend_block_hashes(&mut salted, &tokens[..end], 5, &scope);
            assert_eq!(salted, scoped_block_hashes(&tokens[..end], 5, &scope));
        }
        assert_eq!(inc.len(), 10);
        assert!(block_hashes(&tokens, 0).is_empty());
    }
}
