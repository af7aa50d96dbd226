//! The CPU features the kernels need, detected at run time (false off x86-64).

/// AVX2, FMA and F16C.
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-VNNI (the 256-bit VEX `vpdpbusd`).
pub(crate) fn avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-512 F, BW, VL and VNNI.
pub(crate) fn avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-512 F, VL and DQ (the AVX-512 attention's floating-point operations).
pub(crate) fn avx512_float() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AMX-TILE and AMX-INT8, with the OS's permission to use them ([`crate::amx::available`]).
pub(crate) fn amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
