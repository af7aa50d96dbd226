//! API keys: generation, hashing and constant-time comparison (the pure part).
//!
//! A key is `tidal_` followed by 43 base62 characters (62^43 > 2^256, so at least 32 bytes of
//! entropy). It is shown once; the ledger stores only its SHA-256 and a short display prefix.
//! Authentication looks keys up by prefix and compares hashes with `subtle`, so the compare
//! does not leak how many bytes matched.

use rand::distr::{Alphanumeric, SampleString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every key starts with this.
pub const KEY_PREFIX: &str = "tidal_";
/// Random base62 characters after [`KEY_PREFIX`].
pub const KEY_RANDOM_CHARS: usize = 43;
/// Random characters kept in the display prefix (after [`KEY_PREFIX`]).
pub const DISPLAY_CHARS: usize = 8;

/// A freshly generated key: the secret (show once) and what the ledger stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedKey {
    /// The full secret, e.g. `tidal_3fJ...`.
    pub secret: String,
    /// Display prefix, e.g. `tidal_3fJk9QaZ`.
    pub prefix: String,
    /// SHA-256 of the secret.
    pub hash: [u8; 32],
}

/// Generates a new random key from the OS-seeded thread RNG.
pub fn generate() -> GeneratedKey {
    let random = Alphanumeric.sample_string(&mut rand::rng(), KEY_RANDOM_CHARS);
    from_secret(format!("{KEY_PREFIX}{random}"))
}

fn from_secret(secret: String) -> GeneratedKey {
    let prefix = display_prefix(&secret).unwrap_or_default().to_string();
    let hash = hash_key(&secret);
    GeneratedKey {
        secret,
        prefix,
        hash,
    }
}

/// SHA-256 of a presented key.
pub fn hash_key(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// The display prefix of a well-formed key, `None` for anything that cannot be a key.
pub fn display_prefix(secret: &str) -> Option<&str> {
    let random = secret.strip_prefix(KEY_PREFIX)?;
    if random.len() != KEY_RANDOM_CHARS || !random.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    secret.get(..KEY_PREFIX.len() + DISPLAY_CHARS)
}

/// Constant-time equality of two stored hashes.
pub fn hashes_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with(KEY_PREFIX));
        assert_eq!(a.secret.len(), KEY_PREFIX.len() + KEY_RANDOM_CHARS);
        assert_eq!(display_prefix(&a.secret), Some(a.prefix.as_str()));
        assert_eq!(a.prefix.len(), KEY_PREFIX.len() + DISPLAY_CHARS);
        assert_eq!(a.hash, hash_key(&a.secret));
        assert!(!a.prefix.is_empty() && a.secret.starts_with(&a.prefix));
        // 62^43 >= 2^256: at least 32 bytes of entropy.
        assert!(KEY_RANDOM_CHARS as f64 * 62f64.log2() >= 256.0);
    }

    #[test]
    fn malformed_keys_have_no_prefix() {
        let good = generate().secret;
        assert!(display_prefix(&good).is_some());
        assert!(display_prefix("").is_none());
        assert!(display_prefix("sk-abc").is_none());
        assert!(
            display_prefix(&good[..good.len() - 1]).is_none(),
            "too short"
        );
        assert!(display_prefix(&format!("{good}x")).is_none(), "too long");
        let non_alnum = format!("{KEY_PREFIX}{}", "-".repeat(KEY_RANDOM_CHARS));
        assert!(display_prefix(&non_alnum).is_none());
        let multibyte = format!("{KEY_PREFIX}{}", "é".repeat(KEY_RANDOM_CHARS / 2));
        assert!(display_prefix(&multibyte).is_none());
    }

    #[test]
    fn hash_comparison() {
        let h = hash_key("tidal_x");
        assert!(hashes_equal(&h, &hash_key("tidal_x")));
        assert!(!hashes_equal(&h, &hash_key("tidal_y")));
        assert!(!hashes_equal(&h, &h[..31]));
        // Known SHA-256 vector.
        let abc = hash_key("abc");
        assert_eq!(abc[..4], [0xba, 0x78, 0x16, 0xbf]);
    }
}
