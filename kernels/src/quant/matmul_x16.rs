//! The matmul of a Q4_K matrix repacked into sixteen-row groups ([`super::q4_k_x16`]).
//!
//! With AVX-512 VNNI every batch runs the sixteen-row kernel ([`super::kdot16_avx512`]) on
//! the groups as they are, each group against the activation rows in passes of four, the
//! later passes reading the group (18 KiB at k = 2,048) from cache. It beats the stored
//! layout's K-quant GEMM at every batch measured (criterion `q4_k_x16`, below). AMX batches
//! of [`super::matmul::AMX_MIN_ROWS`] rows or more, and kernels without AVX-512 VNNI, copy
//! each group back to its sixteen stored rows and run the stored-layout path on them
//! ([`super::matmul::KPlan`]). Either way each output is the stored layout's, bit for bit.
//!
//! Measured on a 2-core AMD EPYC (Zen 4, AVX-512 VNNI, no AMX), k = 2,048, one and two
//! threads (criterion `q4_k_x16_*`, time of the repacked layout ÷ the stored one): one row
//! on a matrix in L2 0.39 / 0.43, on four layers of Llama 3.2 1B's Q4_K matrices streaming
//! from memory (97 MB) 0.62 / 0.87; four rows 0.36 / 0.37, eight 0.45 / 0.44.

use super::dot::DotKernel;
use super::format::QuantType;
use super::matmul::{
    check_shapes, for_each_task, KPlan, OutCols, QuantizedActivations, SendPtr, AMX_MIN_ROWS,
};
use super::q4_k::Q4K;
use super::q4_k_x16::{unpack_group, GROUP_ROWS};

/// Whether `kernel` runs [`matmul_q4_k_x16`] on the repacked groups directly (AVX-512
/// VNNI, which AMX implies): where it does not, repacking only adds the copy back.
pub fn reads_q4_k_x16(kernel: DotKernel) -> bool {
    matches!(kernel, DotKernel::Avx512Vnni | DotKernel::Amx) && kernel.is_supported()
}

/// `out[m, n] = x · Wᵀ` for `W` a Q4_K matrix of `n` rows (a multiple of 16) repacked by
/// [`super::q4_k_x16::repack`]: the same results as [`super::matmul::matmul_quantized`] on
/// the stored rows.
///
/// # Panics
/// If the shapes do not match, `n` is not a multiple of 16 or `kernel` is not supported.
pub fn matmul_q4_k_x16(
    kernel: DotKernel,
    xq: &QuantizedActivations,
    w: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let row_bytes = check_shapes(kernel, QuantType::Q4_K, xq, w, n, out);
    assert!(
        n.is_multiple_of(GROUP_ROWS),
        "Q4_K x16 matmul: {n} rows are not whole groups of {GROUP_ROWS}"
    );
    let m = xq.rows();
    let sixteen = reads_q4_k_x16(kernel) && !(kernel == DotKernel::Amx && m >= AMX_MIN_ROWS);
    let Some(plan) = KPlan::new::<Q4K>(kernel, xq, n, out, !sixteen) else {
        return;
    };
    let nb = plan.nb;
    #[cfg(target_arch = "x86_64")]
    let pairs = sixteen.then(|| xq.sum_pairs());
    let group_bytes = GROUP_ROWS * row_bytes;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let task = |c: usize| {
        let j0 = c * plan.rows_per_task;
        let cols = plan.rows_per_task.min(n - j0);
        let wt = &w[j0 * row_bytes..(j0 + cols) * row_bytes];
        // SAFETY: tasks own disjoint column ranges of `out`, which is exclusively borrowed
        // for this call and holds m * n values.
        let mut o = unsafe { OutCols::new(out_ptr, m, n, j0, cols) };
        #[cfg(target_arch = "x86_64")]
        if let Some(pairs) = pairs {
            // SAFETY: AVX-512 VNNI (with AVX2, FMA, F16C) asserted by `check_shapes`; `wt` is
            // `cols / 16` whole groups of `nb` super-blocks, every row of `plan.rows` and
            // `pairs` holds `nb` entries.
            unsafe { super::kdot16_avx512::rows(wt, cols, nb, &plan.rows, pairs, &mut o) };
            return;
        }
        let mut stored = vec![0u8; group_bytes];
        for (g, wg) in wt.chunks_exact(group_bytes).enumerate() {
            unpack_group(wg, nb, &mut stored);
            plan.run::<Q4K>(
                &stored,
                GROUP_ROWS,
                &mut o.window(g * GROUP_ROWS, GROUP_ROWS),
            );
        }
    };
    for_each_task(n, plan.rows_per_task, task);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::{kernels, random_blocks};
    use crate::quant::matmul::matmul_quantized;
    use crate::quant::q4_k_x16::repack;
    use crate::test_util::{random_vec, rng};

    /// Every kernel, every path (the sixteen-row kernel in passes of four and a tail; AMX's
    /// GEMM from 48 rows and the kernels without AVX-512 on copied-back groups), one and
    /// several tasks, short and long rows: the repacked matrix gives the stored one's bits.
    #[test]
    fn repacked_matmul_matches_the_stored_layout_bit_for_bit() {
        let mut r = rng(91);
        let shapes = [
            (1, 256, 16),
            (1, 2048, 512),
            (2, 512, 32),
            (3, 768, 48),
            (4, 1024, 16),
            (5, 256, 64),
            (7, 1280, 32),
            (8, 512, 16),
            (9, 768, 32),
            (16, 2048, 48),
            (49, 512, 32),
            (64, 1024, 16),
        ];
        for (m, k, n) in shapes {
            let w = random_blocks(&mut r, QuantType::Q4_K, n * k / 256);
            let packed = repack(&w, n, k / 256);
            let x = random_vec(&mut r, m * k, 2.0);
            let xq = QuantizedActivations::new(&x, m, k);
            for kernel in kernels() {
                let mut want = vec![0f32; m * n];
                matmul_quantized(kernel, QuantType::Q4_K, &xq, &w, n, &mut want);
                let mut got = vec![f32::NAN; m * n];
                matmul_q4_k_x16(kernel, &xq, &packed, n, &mut got);
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{kernel:?} m {m} k {k} n {n}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "whole groups")]
    fn rows_that_are_not_whole_groups_are_refused() {
        let mut r = rng(92);
        let w = random_blocks(&mut r, QuantType::Q4_K, 8);
        let xq = QuantizedActivations::new(&random_vec(&mut r, 256, 1.0), 1, 256);
        matmul_q4_k_x16(DotKernel::Portable, &xq, &w, 8, &mut [0.0; 8]);
    }
}
