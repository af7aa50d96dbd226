//! Q4_K weights repacked at load into groups of 16 rows, for the sixteen-row AVX-512 VNNI
//! kernel ([`super::kdot16_avx512`]), as llama.cpp repacks Q4_K into groups of eight for its
//! AVX2 kernels: one group's super-block `b` is one 2,304-byte block that holds the 16 rows'
//! super-block `b`, interleaved so that every 64-byte load is one register of 16 lanes, lane
//! `r` = row `r`. The bytes are the stored ones, moved: memory stays the file's size, and a row
//! can be read back ([`row`]).
//!
//! A stored super-block is 36 little-endian words of 4 bytes: word 0 holds `d` and `dmin`
//! (f16), words 1–3 the packed 6-bit scales and minimums, words 4–35 the nibbles (word
//! `4 + 8p + c` = weights `64p + 4c..+4` in its low nibbles and `64p + 32 + 4c..+4` in its
//! high ones). In a group block, row `r`'s word `w ≥ 1` is word `16w + r`, so word `w` of the
//! sixteen rows is one 64-byte load; its `d` is half-word `r` and its `dmin` half-word
//! `16 + r` (words 0–15). The scale words of 16 rows in three registers let ggml's
//! `get_scale_min_k4` run on all of them at once.
//!
//! Groups follow each other, each its `nb` super-blocks in order, so a decode step reads the
//! matrix as one sequential stream.

use rayon::prelude::*;

use super::q4_k::Q4K;
use crate::quant::kformat::KFormat;

/// Rows per group.
pub const GROUP_ROWS: usize = 16;

/// Bytes of one group's super-block.
pub const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * Q4K::BLOCK_BYTES;

/// Words of a stored super-block.
const WORDS: usize = Q4K::BLOCK_BYTES / 4;

/// Row `r`'s stored super-block `src` into group block `dst`.
#[inline(always)]
fn put(src: &[u8], r: usize, dst: &mut [u8]) {
    let (src, dst) = (&src[..Q4K::BLOCK_BYTES], &mut dst[..GROUP_BLOCK_BYTES]);
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    dst[32 + 2 * r..34 + 2 * r].copy_from_slice(&src[2..4]);
    for w in 1..WORDS {
        let at = 4 * (GROUP_ROWS * w + r);
        dst[at..at + 4].copy_from_slice(&src[4 * w..4 * w + 4]);
    }
}

/// Row `r`'s super-block of group block `src`, as stored, into `dst`.
#[inline(always)]
fn take(src: &[u8], r: usize, dst: &mut [u8]) {
    let (src, dst) = (&src[..GROUP_BLOCK_BYTES], &mut dst[..Q4K::BLOCK_BYTES]);
    dst[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    dst[2..4].copy_from_slice(&src[32 + 2 * r..34 + 2 * r]);
    for w in 1..WORDS {
        let at = 4 * (GROUP_ROWS * w + r);
        dst[4 * w..4 * w + 4].copy_from_slice(&src[at..at + 4]);
    }
}

/// Repacks `rows` stored Q4_K rows of `nb` super-blocks (`rows` a multiple of 16).
///
/// # Panics
/// As [`repack_into`].
pub fn repack(w: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    let mut out = vec![0u8; w.len()];
    repack_into(w, rows, nb, &mut out);
    out
}

/// Repacks `rows` stored Q4_K rows of `nb` super-blocks (`rows` a multiple of 16) into `out`
/// (as many bytes), the groups in parallel.
///
/// # Panics
/// If `w` is not `rows × nb` super-blocks, `rows` is not a multiple of 16 or `out` is not
/// `w.len()` bytes.
pub fn repack_into(w: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    assert!(
        rows.is_multiple_of(GROUP_ROWS),
        "Q4_K x16 repack: {rows} rows are not whole groups of {GROUP_ROWS}"
    );
    assert_eq!(
        w.len(),
        rows * nb * Q4K::BLOCK_BYTES,
        "Q4_K x16 repack: the bytes are not {rows} rows of {nb} super-blocks"
    );
    assert_eq!(out.len(), w.len(), "Q4_K x16 repack: output size");
    let group_bytes = (nb * GROUP_BLOCK_BYTES).max(1);
    out.par_chunks_mut(group_bytes)
        .zip(w.par_chunks(group_bytes))
        .for_each(|(dst, src)| {
            let row_bytes = nb * Q4K::BLOCK_BYTES;
            for (b, db) in dst.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
                for r in 0..GROUP_ROWS {
                    put(&src[r * row_bytes + b * Q4K::BLOCK_BYTES..], r, db);
                }
            }
        });
}

/// Row `row` of a repacked matrix of `nb` super-blocks per row, as stored, into `out`
/// (`nb × 144` bytes).
///
/// # Panics
/// If `row` is past the matrix or `out` is short.
pub fn row(packed: &[u8], nb: usize, row: usize, out: &mut [u8]) {
    let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
    let group = &packed[g * nb * GROUP_BLOCK_BYTES..(g + 1) * nb * GROUP_BLOCK_BYTES];
    for (gb, ob) in group
        .chunks_exact(GROUP_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(Q4K::BLOCK_BYTES))
    {
        take(gb, r, ob);
    }
}

/// One group of a repacked matrix (its `nb` group blocks) as its sixteen stored rows, row
/// after row, into `out` (`16 × nb × 144` bytes).
pub(crate) fn unpack_group(packed: &[u8], nb: usize, out: &mut [u8]) {
    let row_bytes = nb * Q4K::BLOCK_BYTES;
    for (b, gb) in packed.chunks_exact(GROUP_BLOCK_BYTES).take(nb).enumerate() {
        for r in 0..GROUP_ROWS {
            take(gb, r, &mut out[r * row_bytes + b * Q4K::BLOCK_BYTES..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::random_blocks;
    use crate::quant::format::QuantType;
    use crate::test_util::rng;

    /// Every row comes back as stored, one at a time and a group at a time, for one and
    /// several super-blocks per row.
    #[test]
    fn repacked_rows_read_back_as_stored() {
        let mut r = rng(7);
        for (rows, nb) in [(16, 1), (32, 3), (48, 8)] {
            let w = random_blocks(&mut r, QuantType::Q4_K, rows * nb);
            let p = repack(&w, rows, nb);
            assert_eq!(p.len(), w.len());
            let row_bytes = nb * Q4K::BLOCK_BYTES;
            let mut back = vec![0u8; row_bytes];
            for i in 0..rows {
                row(&p, nb, i, &mut back);
                assert_eq!(
                    back,
                    w[i * row_bytes..(i + 1) * row_bytes],
                    "row {i} of {rows}×{nb}"
                );
            }
            let mut group = vec![0u8; GROUP_ROWS * row_bytes];
            for (g, packed) in p.chunks_exact(GROUP_ROWS * row_bytes).enumerate() {
                unpack_group(packed, nb, &mut group);
                assert_eq!(
                    group,
                    w[g * group.len()..(g + 1) * group.len()],
                    "group {g}"
                );
            }
        }
    }
}
