//! Scatter of new K/V rows into a paged KV cache (vLLM's `reshape_and_cache`): the cache of a
//! layer is `[num_slots, kv_width]` with `slot = block * block_size + offset`.

/// Writes token `t`'s `k`/`v` rows (`kv_width = n_kv_heads * head_dim` values each) to cache
/// slot `slots[t]`.
///
/// # Panics
/// If `k`/`v` are not `slots.len()` rows of `kv_width`, the caches differ in length, or a slot
/// lies outside the cache.
pub fn write_kv(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k: &[f32],
    v: &[f32],
    slots: &[usize],
    kv_width: usize,
) {
    assert_eq!(
        k.len(),
        slots.len() * kv_width,
        "write_kv: k is not slots.len() rows"
    );
    assert_eq!(v.len(), k.len(), "write_kv: k and v differ in length");
    assert_eq!(
        k_cache.len(),
        v_cache.len(),
        "write_kv: caches differ in length"
    );
    let num_slots = k_cache.len().checked_div(kv_width).unwrap_or(0);
    for (t, &slot) in slots.iter().enumerate() {
        assert!(
            slot < num_slots,
            "write_kv: slot {slot} outside a cache of {num_slots} slots"
        );
        let src = t * kv_width..(t + 1) * kv_width;
        let dst = slot * kv_width..(slot + 1) * kv_width;
        k_cache[dst.clone()].copy_from_slice(&k[src.clone()]);
        v_cache[dst].copy_from_slice(&v[src]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatters_rows_to_their_slots_and_leaves_others() {
        let w = 3;
        let mut kc = vec![-1.0; 6 * w];
        let mut vc = vec![-2.0; 6 * w];
        let k: Vec<f32> = (0..2 * w).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..2 * w).map(|i| 100.0 + i as f32).collect();
        write_kv(&mut kc, &mut vc, &k, &v, &[4, 1], w);
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
    #[should_panic(expected = "outside a cache")]
    fn rejects_out_of_range_slot() {
        let mut kc = vec![0.0; 4];
        let mut vc = vec![0.0; 4];
        write_kv(&mut kc, &mut vc, &[1.0, 2.0], &[1.0, 2.0], &[2], 2);
    }
}
