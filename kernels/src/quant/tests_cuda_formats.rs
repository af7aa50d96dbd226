//! The CUDA kernels' block formats (`cuda/kernels.cu`: `Q4_0` … `Q6_K`, each a `dequant` of
//! one 32-weight sub-block) compiled for the host with the system's C++ compiler and checked
//! against this crate's dequantisers on random blocks. The GPU tests (`cuda/tests.rs`) check
//! the same code on a device, but need one; this runs wherever a C++ compiler does, so every
//! CI run checks the GPU's reading of every format's bits.

use std::path::Path;
use std::process::Command;

use super::dot::tests::random_blocks;
use super::format::QuantType;
use crate::test_util::{rng, skip};

/// The block-format part of the kernel source: from the first format to the matmul template.
fn format_source() -> &'static str {
    let src = include_str!("../cuda/kernels.cu");
    let start = src
        .find("// Q4_0: f16 d")
        .expect("kernels.cu: the Q4_0 format's comment");
    let end = src
        .find("template <typename F>\n__device__ void matmul_blocks")
        .expect("kernels.cu: the matmul template");
    &src[start..end]
}

/// A host program that dequantises a file of blocks of the type named by its first argument
/// with the CUDA source's `dequant` (every sub-block of every block, in order).
const HARNESS: &str = r#"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
#define __device__
#define __forceinline__ inline
static float h2f(u16 h) {
    u32 sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v = exp == 0 ? std::ldexp((float)man, -24)
              : exp == 31 ? (man ? NAN : INFINITY)
                          : std::ldexp((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}
FORMATS
template <typename F> int run(const char* in, const char* out) {
    FILE* f = fopen(in, "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    u8* b = (u8*)malloc(n);
    if (fread(b, 1, n, f) != (size_t)n) return 2;
    fclose(f);
    long blocks = n / F::BYTES;
    float* o = (float*)malloc(sizeof(float) * blocks * F::SUB * 32);
    for (long i = 0; i < blocks; i++)
        for (int s = 0; s < F::SUB; s++) F::dequant(b + i * F::BYTES, s, o + (i * F::SUB + s) * 32);
    FILE* g = fopen(out, "wb");
    fwrite(o, sizeof(float), blocks * F::SUB * 32, g);
    fclose(g);
    return 0;
}
int main(int argc, char** argv) {
#define TYPE(name) if (argc == 4 && !strcmp(argv[1], #name)) return run<name>(argv[2], argv[3]);
    TYPE(Q4_0) TYPE(Q4_1) TYPE(Q5_0) TYPE(Q8_0) TYPE(Q2_K) TYPE(Q3_K) TYPE(Q4_K) TYPE(Q5_K) TYPE(Q6_K)
    return 1;
}
"#;

/// Compiles the harness into `dir`; `None` when there is no C++ compiler.
fn build_harness(dir: &Path) -> Option<std::path::PathBuf> {
    let src = dir.join("formats.cpp");
    std::fs::write(&src, HARNESS.replace("FORMATS", format_source())).unwrap();
    let bin = dir.join("formats");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "kernels.cu's formats do not compile for the host:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(bin)
}

#[test]
fn cuda_block_formats_dequantise_as_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = build_harness(dir.path()) else {
        return skip("no C++ compiler (c++ or $CXX) to build the CUDA formats for the host");
    };
    let mut r = rng(90);
    for ty in QuantType::ALL {
        // Random bits everywhere, sane f16 scales: 96 blocks, several of each sub-block kind.
        let blocks = random_blocks(&mut r, ty, 96);
        let (input, output) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
        std::fs::write(&input, &blocks).unwrap();
        let name = format!("{ty:?}");
        let status = Command::new(&bin)
            .args([name.as_str()])
            .arg(&input)
            .arg(&output)
            .status()
            .unwrap();
        assert!(status.success(), "{ty:?}: the harness failed ({status})");
        let got: Vec<f32> = std::fs::read(&output)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut want = vec![0.0; 96 * ty.block_elems()];
        ty.dequantize(&blocks, &mut want);
        assert_eq!(got.len(), want.len(), "{ty:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{ty:?} weight {i}: CUDA format {g}, CPU {w}"
            );
        }
    }
}
