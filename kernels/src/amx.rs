//! Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later): eight tile registers of
//! up to 16 rows × 64 bytes, and a matrix unit that multiplies two int8 tiles into a tile of
//! i32 sums (`tdpbssd`: 16 × 16 outputs over 64 bytes of k in one instruction, beside the
//! vector units).
//!
//! Rust's AMX intrinsics are unstable (rust-lang/rust#126622), so the few instructions the
//! GEMM needs are written here as inline assembly with the tile numbers as constants. Linux
//! keeps tile state off until a process asks for it (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, the
//! kernel then saves the 8 KiB of tile data on context switches); [`available`] asks once.

use std::arch::asm;
use std::sync::OnceLock;

/// Whether the CPU has AMX-TILE and AMX-INT8 and the OS lets this process use them (asked
/// once per process; the answer is the same for every thread).
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_int8() && request_tile_data())
}

/// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Asks Linux for permission to use tile data (XFEATURE_XTILEDATA); fails on kernels
/// without AMX support.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes the process's permitted xstate.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Other systems: not used (their permission models differ and are untested here).
#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// The 64-byte operand of `ldtilecfg` (palette 1): each tile's rows and bytes per row.
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Every tile unused.
    pub(crate) const fn new() -> Self {
        Self {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        }
    }

    /// Tile `t` holds `rows` rows of `bytes` bytes (at most 16 and 64).
    pub(crate) const fn tile(mut self, t: usize, rows: u8, bytes: u16) -> Self {
        self.colsb[t] = bytes;
        self.rows[t] = rows;
        self
    }
}

/// Configures the tiles of this thread.
///
/// # Safety
/// [`available`] returned true; the configuration is valid (rows ≤ 16, bytes ≤ 64).
#[inline(always)]
pub(crate) unsafe fn load_config(cfg: &TileConfig) {
    // SAFETY: by the caller's contract; ldtilecfg reads the 64 bytes at cfg.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg, options(nostack, readonly)) };
}

/// Returns this thread's tiles to the initial state (cheaper context switches).
///
/// # Safety
/// [`available`] returned true.
#[inline(always)]
pub(crate) unsafe fn release() {
    // SAFETY: by the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Sets tile `T` to zero.
///
/// # Safety
/// Tiles configured ([`load_config`]).
#[inline(always)]
pub(crate) unsafe fn zero<const T: u8>() {
    // SAFETY: by the caller's contract.
    unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
}

/// Loads tile `T`: row `r` from `base + r · stride`.
///
/// # Safety
/// Tiles configured; every row of tile `T` (as configured) readable at its address.
#[inline(always)]
pub(crate) unsafe fn load<const T: u8>(base: *const u8, stride: usize) {
    // SAFETY: by the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm{t}, [{base} + {stride} * 1]",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack, readonly),
        )
    };
}

/// Stores tile `T`: row `r` to `base + r · stride`.
///
/// # Safety
/// Tiles configured; every row of tile `T` writable at its address.
#[inline(always)]
pub(crate) unsafe fn store<const T: u8>(base: *mut u8, stride: usize) {
    // SAFETY: by the caller's contract.
    unsafe {
        asm!(
            "tilestored [{base} + {stride} * 1], tmm{t}",
            t = const T,
            base = in(reg) base,
            stride = in(reg) stride,
            options(nostack),
        )
    };
}

/// `C += A · B` over bytes: `C[i][j] += Σ_k A[i][k] · B[k / 4][4 j + k % 4]` in i32 (`B`
/// holds four consecutive k of a column per dword, the layout of `vpdpbusd`), with `A`
/// signed (`tdpbssd`) or unsigned (`tdpbusd`) and `B` signed. The GEMM passes a constant, so
/// the branch folds away.
///
/// # Safety
/// Tiles configured with matching shapes.
#[inline(always)]
pub(crate) unsafe fn dot<const C: u8, const A: u8, const B: u8>(signed_a: bool) {
    // SAFETY (both): by the caller's contract.
    if signed_a {
        unsafe {
            asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                options(nostack, nomem))
        };
    } else {
        unsafe {
            asm!("tdpbusd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                options(nostack, nomem))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_the_64_bytes_ldtilecfg_reads() {
        assert_eq!(std::mem::size_of::<TileConfig>(), 64);
        let c = TileConfig::new().tile(2, 16, 64);
        assert_eq!((c.palette, c.rows[2], c.colsb[2]), (1, 16, 64));
    }

    /// One tile product against the scalar definition, signed and unsigned A (only where
    /// the CPU has AMX; the GEMM tests cover the rest).
    #[test]
    fn tile_products_match_the_definition() {
        if !available() {
            return;
        }
        let a: Vec<u8> = (0..16 * 32).map(|i| (i * 37 % 251) as u8).collect();
        let b: Vec<u8> = (0..8 * 64).map(|i| (i * 53 % 241) as u8).collect();
        for signed_a in [true, false] {
            let mut c = [0i32; 256];
            let cfg = TileConfig::new()
                .tile(0, 16, 32)
                .tile(1, 8, 64)
                .tile(2, 16, 64);
            // SAFETY: AMX available; a is 16 rows of 32 bytes, b 8 of 64, c 16 of 64.
            unsafe {
                load_config(&cfg);
                zero::<2>();
                load::<0>(a.as_ptr(), 32);
                load::<1>(b.as_ptr(), 64);
                dot::<2, 0, 1>(signed_a);
                store::<2>(c.as_mut_ptr() as *mut u8, 64);
                release();
            }
            for i in 0..16 {
                for j in 0..16 {
                    let want: i32 = (0..32)
                        .map(|k| {
                            let x = a[i * 32 + k];
                            let x = if signed_a { x as i8 as i32 } else { x as i32 };
                            x * b[(k / 4) * 64 + 4 * j + k % 4] as i8 as i32
                        })
                        .sum();
                    assert_eq!(c[i * 16 + j], want, "signed A {signed_a}, [{i}][{j}]");
                }
            }
        }
    }
}
