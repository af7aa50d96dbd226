//! Block hash chain for prefix caching (vLLM v1 `kv_cache_utils.hash_block_tokens`).
//!
//! A full block's identity is `H(parent identity, block tokens)`, so two sequences share a
//! block's name only when their whole prefix up to and including that block is equal. The
//! hash is 64-bit FNV-1a: fixed, seedless and the same on every machine and run, so cache
//! identities are reproducible. Collisions are harmless: the pool compares contents on lookup.

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
    // A tag byte keeps "no parent" distinct from any parent hash value.
    let mut h = match parent {
        None => fnv1a_extend(FNV_OFFSET_BASIS, &[0]),
        Some(p) => fnv1a_extend(fnv1a_extend(FNV_OFFSET_BASIS, &[1]), &p.0.to_le_bytes()),
    };
    // The length keeps blocks of different sizes apart.
    h = fnv1a_extend(h, &(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h = fnv1a_extend(h, &t.to_le_bytes());
    }
    BlockHash(h)
}

/// Extends `hashes` (the chain of the first `hashes.len()` full blocks of `tokens`) with the
/// hashes of every further full block of `tokens`.
pub fn extend_block_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
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
        hashes.push(hash_block(parent, chunk));
    }
}

/// Hashes of every full block of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend_block_hashes(&mut hashes, tokens, block_size);
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
    fn extending_incrementally_equals_hashing_at_once() {
        let tokens: Vec<u32> = (0..50).map(|i| i * 7 % 13).collect();
        let mut inc = Vec::new();
        for end in 0..=tokens.len() {
            extend_block_hashes(&mut inc, &tokens[..end], 5);
            assert_eq!(inc, block_hashes(&tokens[..end], 5));
        }
        assert_eq!(inc.len(), 10);
        assert!(block_hashes(&tokens, 0).is_empty());
    }
}
