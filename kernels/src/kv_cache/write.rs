//! Scatter of new K/V rows into a paged KV cache (vLLM's `reshape_and_cache`), converting to
//! the cache's element type on the way in: f16 rounds, int8 quantises each (token, KV head)
//! with its own scale ([`super::quantize_int8`]).

use super::{quantize_int8, KvCacheMut};

/// Largest finite f16: larger magnitudes saturate here instead of becoming infinities that
/// would turn attention into NaN.
const F16_MAX: f32 = 65504.0;

/// Writes token `t`'s `k`/`v` rows (`n_kv_heads * head_dim` values each) to cache slot
/// `slots[t]`.
///
/// # Panics
/// If `k`/`v` are not `slots.len()` rows, a cache is not whole rows (or an int8 cache's scales
/// are not one per slot and head), or a slot lies outside a cache.
pub fn write_kv(
    k_cache: KvCacheMut<'_>,
    v_cache: KvCacheMut<'_>,
    k: &[f32],
    v: &[f32],
    slots: &[usize],
    n_kv_heads: usize,
    head_dim: usize,
) {
    let kv_width = n_kv_heads * head_dim;
    assert_eq!(
        k.len(),
        slots.len() * kv_width,
        "write_kv: k is not slots.len() rows"
    );
    assert_eq!(v.len(), k.len(), "write_kv: k and v differ in length");
    write_one(k_cache, k, slots, n_kv_heads, head_dim);
    write_one(v_cache, v, slots, n_kv_heads, head_dim);
}

fn write_one(cache: KvCacheMut<'_>, x: &[f32], slots: &[usize], n_kv_heads: usize, hd: usize) {
    let kv_width = n_kv_heads * hd;
    let num_slots = |len: usize| {
        assert!(
            len.is_multiple_of(kv_width.max(1)),
            "write_kv: cache is not rows of {kv_width}"
        );
        let n = len.checked_div(kv_width).unwrap_or(0);
        for &slot in slots {
            assert!(
                slot < n,
                "write_kv: slot {slot} outside a cache of {n} slots"
            );
        }
        n
    };
    let rows = slots
        .iter()
        .enumerate()
        .map(|(t, &slot)| (&x[t * kv_width..(t + 1) * kv_width], slot * kv_width));
    match cache {
        KvCacheMut::F32(c) => {
            num_slots(c.len());
            for (src, at) in rows {
                c[at..at + kv_width].copy_from_slice(src);
            }
        }
        KvCacheMut::F16(c) => {
            num_slots(c.len());
            for (src, at) in rows {
                for (d, s) in c[at..at + kv_width].iter_mut().zip(src) {
                    *d = half::f16::from_f32(s.clamp(-F16_MAX, F16_MAX));
                }
            }
        }
        KvCacheMut::Int8 { values, scales } => {
            let n = num_slots(values.len());
            assert_eq!(
                scales.len(),
                n * n_kv_heads,
                "write_kv: int8 scales are not one per slot and head"
            );
            for (src, at) in rows {
                let first_head = at / hd.max(1);
                for (h, (xs, qs)) in src
                    .chunks_exact(hd)
                    .zip(values[at..at + kv_width].chunks_exact_mut(hd))
                    .enumerate()
                {
                    scales[first_head + h] = quantize_int8(xs, qs);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvBuffer, KvDtype};
    use crate::test_util::{random_vec, read_row, rng};

    #[test]
    fn scatters_rows_to_their_slots_and_leaves_others() {
        let w = 3;
        let mut kc = vec![-1.0; 6 * w];
        let mut vc = vec![-2.0; 6 * w];
        let k: Vec<f32> = (0..2 * w).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..2 * w).map(|i| 100.0 + i as f32).collect();
        write_kv((&mut kc).into(), (&mut vc).into(), &k, &v, &[4, 1], 1, w);
        assert_eq!(&kc[4 * w..5 * w], &[0.0, 1.0, 2.0]);
        assert_eq!(&kc[w..2 * w], &[3.0, 4.0, 5.0]);
        assert_eq!(&vc[4 * w..5 * w], &[100.0, 101.0, 102.0]);
        assert_eq!(&vc[w..2 * w], &[103.0, 104.0, 105.0]);
        for s in [0, 2, 3, 5] {
            assert!(kc[s * w..(s + 1) * w].iter().all(|x| *x == -1.0));
            assert!(vc[s * w..(s + 1) * w].iter().all(|x| *x == -2.0));
        }
    }

    #[test]
    fn every_dtype_round_trips_within_its_rounding_bound() {
        let mut r = rng(12);
        for (nkv, hd) in [(1, 1), (3, 64), (2, 7), (4, 33)] {
            let slots = [5usize, 0, 3];
            let k = random_vec(&mut r, slots.len() * nkv * hd, 4.0);
            let v = random_vec(&mut r, slots.len() * nkv * hd, 0.5);
            for dtype in KvDtype::ALL {
                let mut kc = KvBuffer::new(dtype, 6, nkv, hd);
                let mut vc = KvBuffer::new(dtype, 6, nkv, hd);
                write_kv(kc.view_mut(), vc.view_mut(), &k, &v, &slots, nkv, hd);
                for (cache, x) in [(&kc, &k), (&vc, &v)] {
                    for (t, &slot) in slots.iter().enumerate() {
                        let got = read_row(cache.view(), slot, nkv, hd);
                        let want = &x[t * nkv * hd..(t + 1) * nkv * hd];
                        for (head_got, head_want) in got.chunks(hd).zip(want.chunks(hd)) {
                            let amax = head_want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                            for (g, w) in head_got.iter().zip(head_want) {
                                let bound = match dtype {
                                    KvDtype::F32 => 0.0,
                                    // Half an ulp; subnormal f16s have a fixed step of 2^-24.
                                    KvDtype::F16 => (w.abs() * 2f32.powi(-11)).max(2f32.powi(-25)),
                                    KvDtype::Int8 => amax / 254.0 * (1.0 + 1e-5),
                                };
                                assert!((g - w).abs() <= bound, "{dtype} {nkv}x{hd}: {g} vs {w}");
                            }
                        }
                    }
                    // Slots never written stay zero.
                    for slot in [1, 2, 4] {
                        assert!(read_row(cache.view(), slot, nkv, hd)
                            .iter()
                            .all(|v| *v == 0.0));
                    }
                }
            }
        }
    }

    #[test]
    fn f16_saturates_instead_of_overflowing() {
        let mut kc = KvBuffer::new(KvDtype::F16, 1, 1, 2);
        let mut vc = KvBuffer::new(KvDtype::F16, 1, 1, 2);
        write_kv(
            kc.view_mut(),
            vc.view_mut(),
            &[1e9, -1e9],
            &[0.0, 1.0],
            &[0],
            1,
            2,
        );
        assert_eq!(read_row(kc.view(), 0, 1, 2), vec![65504.0, -65504.0]);
    }

    #[test]
    #[should_panic(expected = "outside a cache")]
    fn rejects_out_of_range_slot() {
        let mut kc = vec![0.0; 4];
        let mut vc = vec![0.0; 4];
        write_kv(
            (&mut kc).into(),
            (&mut vc).into(),
            &[1.0, 2.0],
            &[1.0, 2.0],
            &[2],
            1,
            2,
        );
    }

    #[test]
    #[should_panic(expected = "one per slot and head")]
    fn rejects_int8_cache_with_wrong_scale_count() {
        let mut values = vec![0i8; 8];
        let mut scales = vec![0.0f32; 3];
        let mut vc = KvBuffer::new(KvDtype::Int8, 2, 2, 2);
        write_kv(
            KvCacheMut::Int8 {
                values: &mut values,
                scales: &mut scales,
            },
            vc.view_mut(),
            &[1.0; 4],
            &[1.0; 4],
            &[0],
            2,
            2,
        );
    }
}
