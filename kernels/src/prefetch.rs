//! Software prefetch for the streams the hardware prefetcher serves too late: a decode step
//! reads every weight once, row after row, and paged attention hops between scattered KV
//! blocks. Without it, perf put most of the row kernel's samples on the first load of each
//! cache line (decode of SmolLM2 Q8_0 went from 73 to 101 tokens/s on a 2-core AVX-512 Xeon
//! with 18-22 GB/s, see docs/benchmarks.md).
//!
//! A prefetch is a hint: it never faults and changes no result, so addresses are computed
//! with `wrapping_add` and may point past the data (then the hint is wasted, nothing else).

/// Bytes of one cache line.
pub(crate) const LINE: usize = 64;

/// Asks for the `lines` cache lines from `p` on to be brought into L1.
#[inline(always)]
pub(crate) fn lines(p: *const u8, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in 0..lines {
        // SAFETY: `prefetcht0` is baseline x86-64 (SSE) and has no memory effects.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(i * LINE) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, lines);
}

/// Asks for every cache line that holds a byte of `p..p + len` to be brought into L1.
#[inline(always)]
pub(crate) fn range(p: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let skew = p as usize % LINE;
    lines(p.wrapping_sub(skew), (skew + len).div_ceil(LINE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_past_any_data_is_harmless() {
        let v = [1u8; 10];
        lines(v.as_ptr().wrapping_add(1 << 20), 4);
        range(v.as_ptr().wrapping_add(usize::MAX / 2), 4096);
        range(std::ptr::null(), 64);
        range(v.as_ptr(), 0);
        assert_eq!(v, [1u8; 10]);
    }
}
