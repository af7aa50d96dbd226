// CUDA kernels of the forward pass, compiled at run time with NVRTC (no CUDA toolkit is
// needed to build Tidal). Each kernel follows the CPU kernel of the same name in
// `tidal-kernels`, which is its oracle in the tests (kernels/src/cuda/tests.rs).
//
// No headers: NVRTC's bundled headers differ between CUDA versions, so half conversions are
// written as the PTX `cvt` instructions they compile to.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define WARP 32
// Warps of one attention block: each walks a strided quarter of the context.
#define ATTN_WARPS 4
// Largest head dimension the attention kernel holds in registers (8 values per lane).
#define MAX_HEAD_DIM 256
// Activation rows one matmul block multiplies with each weight row it reads.
#define MM_ROWS 8
// Weight rows (one per warp) of one matmul block.
#define MM_WARPS 4
// -infinity without math headers.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of `v` over a block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int warps = blockDim.x / WARP;
    v = lane < warps ? partial[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

// ---- element-wise -------------------------------------------------------------------------

// orow = xr / sqrt(mean(xr^2) + eps) * w over one row of d values. In place when orow == xr:
// each thread writes only the values it alone read.
__device__ void rms_norm_row(const float* xr, const float* w, float* orow, int d, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) orow[i] = xr[i] * inv * w[i];
}

// out = x / sqrt(mean(x^2) + eps) * w, one block per row of d values.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int d, float eps) {
    size_t at = (size_t)blockIdx.x * d;
    rms_norm_row(x + at, w, out + at, d, eps);
}

// rms_norm in place, one block per row of d values (Gemma 3's per-head Q/K norms and its
// post-attention and post-FFN norms).
extern "C" __global__ void rms_norm_in_place(float* x, const float* w, int d, float eps) {
    float* row = x + (size_t)blockIdx.x * d;
    rms_norm_row(row, w, row, d, eps);
}

// gate = silu(gate) * up over n values.
extern "C" __global__ void silu_mul(float* gate, const float* up, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// gate = gelu(gate) * up over n values, GELU's tanh approximation written as the CPU's
// `gelu_mul` evaluates it: 0.5 (1 + tanh z) = 1 / (1 + e^-2z), z = sqrt(2/pi) (g + 0.044715 g^3).
extern "C" __global__ void gelu_mul(float* gate, const float* up, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        float a = 2.0f * 0.7978846f * (g + 0.044715f * g * g * g);
        gate[i] = g / (1.0f + expf(-a)) * up[i];
    }
}

// x += y over n values.
extern "C" __global__ void add_into(float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x[r, c] += bias[c] over n values of rows of `width`.
extern "C" __global__ void add_bias(float* x, const float* bias, int n, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += bias[i % width];
}

// out[r] = x[rows[r]] for rows of d values.
extern "C" __global__ void gather_rows(const float* x, const int* rows, float* out, int d) {
    const float* src = x + (size_t)rows[blockIdx.x] * d;
    float* dst = out + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
}

// Rotary embedding in place on x [n_tokens, n_heads, head_dim]; one thread per rotated pair.
// neox = 0: pairs (2i, 2i+1); neox = 1: pairs (i, i + head_dim/2).
extern "C" __global__ void rope(float* x, const int* positions, const float* inv_freq,
                                int n_tokens, int n_heads, int head_dim, int neox) {
    int half_d = head_dim / 2;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n_tokens * n_heads * half_d;
    if (idx >= total) return;
    int i = (int)(idx % half_d);
    long long th = idx / half_d;  // token * n_heads + head
    int t = (int)(th / n_heads);
    float* head = x + th * head_dim;
    float s, c;
    sincosf((float)positions[t] * inv_freq[i], &s, &c);
    int a_at = neox ? i : 2 * i;
    int b_at = neox ? i + half_d : 2 * i + 1;
    float a = head[a_at], b = head[b_at];
    head[a_at] = a * c - b * s;
    head[b_at] = a * s + b * c;
}

// ---- KV cache -----------------------------------------------------------------------------
// A layer's cache is [num_slots, n_kv_heads, head_dim]; int8 adds one f32 scale per
// (slot, KV head). Grid: (n_tokens, n_kv_heads), one warp per (token, head).

__device__ __forceinline__ float f16_saturate(float v) {
    // Largest finite f16; NaN stays NaN.
    return v != v ? v : fminf(fmaxf(v, -65504.0f), 65504.0f);
}

extern "C" __global__ void write_kv_f32(float* cache, const float* x, const int* slots,
                                        int n_kv_heads, int head_dim) {
    int t = blockIdx.x, h = blockIdx.y, w = n_kv_heads * head_dim;
    const float* src = x + (size_t)t * w + h * head_dim;
    float* dst = cache + (size_t)slots[t] * w + h * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += WARP) dst[i] = src[i];
}

extern "C" __global__ void write_kv_f16(u16* cache, const float* x, const int* slots,
                                        int n_kv_heads, int head_dim) {
    int t = blockIdx.x, h = blockIdx.y, w = n_kv_heads * head_dim;
    const float* src = x + (size_t)t * w + h * head_dim;
    u16* dst = cache + (size_t)slots[t] * w + h * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += WARP) dst[i] = f2h(f16_saturate(src[i]));
}

// Symmetric absmax: scale = max|x| / 127, q = round(x * 127 / max|x|), as quantize_int8.
extern "C" __global__ void write_kv_int8(i8* cache, float* scales, const float* x,
                                         const int* slots, int n_kv_heads, int head_dim) {
    int t = blockIdx.x, h = blockIdx.y, w = n_kv_heads * head_dim;
    const float* src = x + (size_t)t * w + h * head_dim;
    size_t slot = (size_t)slots[t];
    i8* dst = cache + slot * w + h * head_dim;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += WARP) amax = fmaxf(amax, fabsf(src[i]));
    amax = warp_max(amax);
    bool usable = amax != 0.0f && isfinite(amax);
    float inv = usable ? 127.0f / amax : 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += WARP) {
        float q = roundf(src[i] * inv);
        q = q != q ? 0.0f : fminf(fmaxf(q, -128.0f), 127.0f);
        dst[i] = usable ? (i8)q : (i8)0;
    }
    if (threadIdx.x == 0) scales[slot * n_kv_heads + h] = usable ? amax / 127.0f : 0.0f;
}

// ---- paged attention ----------------------------------------------------------------------
// q, out: [n_tokens, n_heads, head_dim]. Token t sits at position tok_pos[t] of its sequence,
// whose block table starts at block_tables[tok_table[t]]; it attends to positions
// 0..=tok_pos[t], or with a sliding window w > 0 (Gemma 3's local layers) to the w positions
// tok_pos[t] + 1 - w..=tok_pos[t] only, never reading the blocks behind them. One block of ATTN_WARPS warps per (token, head): each warp runs an online
// softmax over a strided share of the positions, then the warps' partial results merge.

struct KvF32 {
    const float* v;
    __device__ float get(size_t slot_row, int i, size_t scale_at) const { return v[slot_row + i]; }
};
struct KvF16 {
    const u16* v;
    __device__ float get(size_t slot_row, int i, size_t scale_at) const { return h2f(v[slot_row + i]); }
};
struct KvInt8 {
    const i8* v;
    const float* s;
    __device__ float get(size_t slot_row, int i, size_t scale_at) const {
        return (float)v[slot_row + i] * s[scale_at];
    }
};

template <typename Kv>
__device__ void attention(const float* q, Kv k, Kv v, const int* tok_pos, const int* tok_table,
                          const int* block_tables, float* out, int n_heads, int n_kv_heads,
                          int head_dim, int block_size, float scale, int window) {
    const int PER_LANE = MAX_HEAD_DIM / WARP;
    __shared__ float warp_m[ATTN_WARPS], warp_l[ATTN_WARPS];
    __shared__ float warp_acc[ATTN_WARPS][MAX_HEAD_DIM];
    int t = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int kvh = h / (n_heads / n_kv_heads);
    int kv_width = n_kv_heads * head_dim;
    const float* qh = q + ((size_t)t * n_heads + h) * head_dim;
    const int* table = block_tables + tok_table[t];
    int ctx = tok_pos[t] + 1;
    int first = window > 0 && ctx > window ? ctx - window : 0;

    float qv[PER_LANE], acc[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int i = lane + j * WARP;
        qv[j] = i < head_dim ? qh[i] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int p = first + warp; p < ctx; p += ATTN_WARPS) {
        size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        size_t row = slot * kv_width + (size_t)kvh * head_dim;
        size_t scale_at = slot * n_kv_heads + kvh;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            int i = lane + j * WARP;
            if (i < head_dim) s += qv[j] * k.get(row, i, scale_at);
        }
        s = warp_sum(s);
        float m_new = fmaxf(m, s);
        float correction = expf(m - m_new);
        float weight = expf(s - m_new);
        l = l * correction + weight;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            int i = lane + j * WARP;
            if (i < head_dim) acc[j] = acc[j] * correction + weight * v.get(row, i, scale_at);
        }
        m = m_new;
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int i = lane + j * WARP;
        if (i < head_dim) warp_acc[warp][i] = acc[j];
    }
    __syncthreads();
    float m_all = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; w++) m_all = fmaxf(m_all, warp_m[w]);
    float l_all = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++)
        if (warp_l[w] > 0.0f) l_all += warp_l[w] * expf(warp_m[w] - m_all);
    float* oh = out + ((size_t)t * n_heads + h) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (warp_l[w] > 0.0f) sum += warp_acc[w][i] * expf(warp_m[w] - m_all);
        oh[i] = sum / l_all;
    }
}

#define ATTENTION_ARGS                                                                  \
    const float *q, const int *tok_pos, const int *tok_table, const int *block_tables,  \
        float *out, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,  \
        int window
#define ATTENTION_PASS                                                                    \
    tok_pos, tok_table, block_tables, out, n_heads, n_kv_heads, head_dim, block_size, scale, \
        window

extern "C" __global__ void paged_attention_f32(const float* kc, const float* vc, ATTENTION_ARGS) {
    attention(q, KvF32{kc}, KvF32{vc}, ATTENTION_PASS);
}

extern "C" __global__ void paged_attention_f16(const u16* kc, const u16* vc, ATTENTION_ARGS) {
    attention(q, KvF16{kc}, KvF16{vc}, ATTENTION_PASS);
}

extern "C" __global__ void paged_attention_int8(const i8* kc, const float* ks, const i8* vc,
                                                const float* vs, ATTENTION_ARGS) {
    attention(q, KvInt8{kc, ks}, KvInt8{vc, vs}, ATTENTION_PASS);
}

// ---- quantised matmul ---------------------------------------------------------------------
// y[m, n] = x[m, k] · W[n, k]^T with W in GGUF block layout, read as rows of k/32 sub-blocks
// of 32 weights (a 32-weight format's block is one; a K-quant super-block of 256 weights is
// SUB = 8 of them). Grid: (ceil(n / MM_WARPS), ceil(m / MM_ROWS)); each warp owns one weight
// row and MM_ROWS activation rows; lane j dequantises sub-blocks j, j+32, ... of its row.
// Blocks of 22, 110 or 210 bytes leave multi-byte fields only 2-byte aligned, so beyond the
// f16 scales (always at even offsets) the formats read single bytes. The formats are checked
// against the CPU's dequantisers on the host too (kernels/src/quant/tests_cuda_formats.rs).

// Q4_0: f16 d, 16 bytes of nibbles; w = (q - 8) * d. Low nibbles are weights 0..15.
struct Q4_0 {
    static const int BYTES = 18;
    static const int SUB = 1;
    __device__ static void dequant(const u8* b, int, float* out) {
        float d = h2f(*(const u16*)b);
        const u16* qs = (const u16*)(b + 2);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            u16 two = qs[j];
            out[2 * j] = (float)((int)(two & 0xF) - 8) * d;
            out[2 * j + 1] = (float)((int)((two >> 8) & 0xF) - 8) * d;
            out[2 * j + 16] = (float)((int)((two >> 4) & 0xF) - 8) * d;
            out[2 * j + 17] = (float)((int)(two >> 12) - 8) * d;
        }
    }
};

// Q4_1: f16 d, f16 min, 16 bytes of nibbles; w = q * d + min.
struct Q4_1 {
    static const int BYTES = 20;
    static const int SUB = 1;
    __device__ static void dequant(const u8* b, int, float* out) {
        float d = h2f(*(const u16*)b);
        float mn = h2f(*(const u16*)(b + 2));
        const u32* qs = (const u32*)(b + 4);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 four = qs[j];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 byte = (four >> (8 * k)) & 0xFF;
                out[4 * j + k] = (float)(byte & 0xF) * d + mn;
                out[4 * j + k + 16] = (float)(byte >> 4) * d + mn;
            }
        }
    }
};

// Q8_0: f16 d, 32 signed bytes; w = q * d.
struct Q8_0 {
    static const int BYTES = 34;
    static const int SUB = 1;
    __device__ static void dequant(const u8* b, int, float* out) {
        float d = h2f(*(const u16*)b);
        const u16* qs = (const u16*)(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u16 two = qs[j];
            out[2 * j] = (float)(i8)(two & 0xFF) * d;
            out[2 * j + 1] = (float)(i8)(two >> 8) * d;
        }
    }
};

// Q5_0: f16 d, 4 bytes of fifth bits (bit j: weight j), 16 bytes of nibbles (low nibbles are
// weights 0..15); w = (q - 16) * d.
struct Q5_0 {
    static const int BYTES = 22;
    static const int SUB = 1;
    __device__ static void dequant(const u8* b, int, float* out) {
        float d = h2f(*(const u16*)b);
        u32 qh = (u32)b[2] | (u32)b[3] << 8 | (u32)b[4] << 16 | (u32)b[5] << 24;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u32 byte = b[6 + j];
            out[j] = (float)((int)((byte & 0xF) | ((qh >> j) & 1) << 4) - 16) * d;
            out[j + 16] = (float)((int)((byte >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16) * d;
        }
    }
};

// The K-quants (kernels/src/quant/q*_k.rs has each layout): `dequant` writes sub-block
// `sub` (weights 32 sub .. 32 sub + 32) of a super-block.

// Q4_K's and Q5_K's 6-bit scale and minimum of 32-weight sub-block j (ggml's
// get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *mn = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *mn = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales, 128 bytes of nibbles (byte l of 32-byte run r:
// weight 64 r + l low, 64 r + 32 + l high); w = d · sc · q − dmin · m.
struct Q4_K {
    static const int BYTES = 144;
    static const int SUB = 8;
    __device__ static void dequant(const u8* b, int sub, float* out) {
        float sc, mn;
        scale_min_k4(sub, b + 4, &sc, &mn);
        float dl = h2f(*(const u16*)b) * sc, ml = h2f(*(const u16*)(b + 2)) * mn;
        const u8* q = b + 16 + 32 * (sub / 2);
        int shift = 4 * (sub % 2);
#pragma unroll
        for (int l = 0; l < 32; l++) out[l] = dl * (float)((q[l] >> shift) & 0xF) - ml;
    }
};

// Q5_K: Q4_K's header, 32 bytes of fifth bits (bit s of byte l: weight 32 s + l), then
// Q4_K's nibbles.
struct Q5_K {
    static const int BYTES = 176;
    static const int SUB = 8;
    __device__ static void dequant(const u8* b, int sub, float* out) {
        float sc, mn;
        scale_min_k4(sub, b + 4, &sc, &mn);
        float dl = h2f(*(const u16*)b) * sc, ml = h2f(*(const u16*)(b + 2)) * mn;
        const u8* qh = b + 16;
        const u8* q = b + 48 + 32 * (sub / 2);
        int shift = 4 * (sub % 2);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0xF) | ((qh[l] >> sub) & 1) << 4;
            out[l] = dl * (float)v - ml;
        }
    }
};

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed scales (one per 16
// weights), f16 d; w = d · sc · (q − 32). In 128-weight half h, sub-block c (0..3) takes
// the low (c < 2) or high nibbles of low bytes 64 h + 32 (c % 2) + l and bits 2c, 2c + 1 of
// high byte 32 h + l.
struct Q6_K {
    static const int BYTES = 210;
    static const int SUB = 8;
    __device__ static void dequant(const u8* b, int sub, float* out) {
        float d = h2f(*(const u16*)(b + 208));
        int h = sub / 4, c = sub % 4;
        const u8* ql = b + 64 * h + 32 * (c % 2);
        const u8* qh = b + 128 + 32 * h;
        int shift = c < 2 ? 0 : 4;
        float d0 = d * (float)(i8)b[192 + 2 * sub], d1 = d * (float)(i8)b[193 + 2 * sub];
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = ((ql[l] >> shift) & 0xF) | ((qh[l] >> (2 * c)) & 3) << 4;
            out[l] = (l < 16 ? d0 : d1) * (float)(v - 32);
        }
    }
};

// Q3_K: 32 bytes of third bits (bit c of byte l: weight 32 c + l), 64 bytes of bit pairs
// (weight 32 c + l: bits 2 (c % 4) of byte 32 (c / 4) + l), 12 bytes of sixteen 6-bit
// scales stored + 32, f16 d; w = d · (sc − 32) · (q − 4).
struct Q3_K {
    static const int BYTES = 110;
    static const int SUB = 8;
    __device__ static int scale(const u8* s, int g) {
        int low = g < 8 ? s[g] & 0xF : s[g - 8] >> 4;
        int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        return (low | high << 4) - 32;
    }
    __device__ static void dequant(const u8* b, int sub, float* out) {
        float d = h2f(*(const u16*)(b + 108));
        const u8* qs = b + 32 + 32 * (sub / 4);
        int shift = 2 * (sub % 4);
        float d0 = d * (float)scale(b + 96, 2 * sub), d1 = d * (float)scale(b + 96, 2 * sub + 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = ((qs[l] >> shift) & 3) | ((b[l] >> sub) & 1) << 2;
            out[l] = (l < 16 ? d0 : d1) * (float)(v - 4);
        }
    }
};

// Q2_K: 16 bytes of scale (low nibble) and minimum (high nibble) per 16 weights, 64 bytes of
// bit pairs laid out as Q3_K's, f16 d, f16 dmin; w = d · sc · q − dmin · m.
struct Q2_K {
    static const int BYTES = 84;
    static const int SUB = 8;
    __device__ static void dequant(const u8* b, int sub, float* out) {
        float d = h2f(*(const u16*)(b + 80)), dmin = h2f(*(const u16*)(b + 82));
        const u8* qs = b + 16 + 32 * (sub / 4);
        int shift = 2 * (sub % 4);
        u8 s0 = b[2 * sub], s1 = b[2 * sub + 1];
        float d0 = d * (float)(s0 & 0xF), m0 = dmin * (float)(s0 >> 4);
        float d1 = d * (float)(s1 & 0xF), m1 = dmin * (float)(s1 >> 4);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            float q = (float)((qs[l] >> shift) & 3);
            out[l] = l < 16 ? d0 * q - m0 : d1 * q - m1;
        }
    }
};

template <typename F>
__device__ void matmul_blocks(const u8* w, const float* x, float* y, int m, int n, int k) {
    int lane = threadIdx.x % WARP;
    int row = blockIdx.x * MM_WARPS + threadIdx.x / WARP;
    if (row >= n) return;
    int m0 = blockIdx.y * MM_ROWS;
    int rows = min(MM_ROWS, m - m0);
    int nb = k / 32;
    const u8* wr = w + (size_t)row * (nb / F::SUB) * F::BYTES;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int b = lane; b < nb; b += WARP) {
        float wv[32];
        F::dequant(wr + (size_t)(b / F::SUB) * F::BYTES, b % F::SUB, wv);
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            if (r < rows) {
                const float4* xr = (const float4*)(x + (size_t)(m0 + r) * k + b * 32);
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float4 xv = xr[j];
                    s += wv[4 * j] * xv.x + wv[4 * j + 1] * xv.y + wv[4 * j + 2] * xv.z +
                         wv[4 * j + 3] * xv.w;
                }
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < rows) y[(size_t)(m0 + r) * n + row] = s;
    }
}

// The same product for larger m: a block stages MM_ROWS activation rows in shared memory,
// MM_KTILE columns at a time, and each warp multiplies them with MM_ROWS_PER_WARP weight rows
// (lane = weight row × block of the tile), so activations are read from device memory once per
// block instead of once per weight row.
#define MM_KTILE 256
#define MM_TILE_BLOCKS (MM_KTILE / 32)
#define MM_ROWS_PER_WARP (WARP / MM_TILE_BLOCKS)
// Staged rows pad each 32-value block by one float so that lanes on different blocks read
// different shared-memory banks.
#define MM_XSTRIDE (MM_TILE_BLOCKS * 33)

template <typename F>
__device__ void matmul_tiled(const u8* w, const float* x, float* y, int m, int n, int k) {
    __shared__ float xs[MM_ROWS][MM_XSTRIDE];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int sub = lane / MM_TILE_BLOCKS;
    int bi = lane % MM_TILE_BLOCKS;
    int row = (blockIdx.x * MM_WARPS + warp) * MM_ROWS_PER_WARP + sub;
    int m0 = blockIdx.y * MM_ROWS;
    int rows = min(MM_ROWS, m - m0);
    int nb = k / 32;
    const u8* wr = w + (size_t)(row < n ? row : 0) * (nb / F::SUB) * F::BYTES;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += MM_KTILE) {
        int cols = min(MM_KTILE, k - k0);
        __syncthreads();  // the previous tile has been read
        for (int i = threadIdx.x; i < rows * MM_KTILE; i += blockDim.x) {
            int r = i / MM_KTILE, c = i % MM_KTILE;
            xs[r][(c / 32) * 33 + c % 32] = c < cols ? x[(size_t)(m0 + r) * k + k0 + c] : 0.0f;
        }
        __syncthreads();
        if (row < n && bi * 32 < cols) {
            float wv[32];
            int b = k0 / 32 + bi;
            F::dequant(wr + (size_t)(b / F::SUB) * F::BYTES, b % F::SUB, wv);
#pragma unroll
            for (int r = 0; r < MM_ROWS; r++) {
                if (r < rows) {
                    const float* xr = &xs[r][bi * 33];
                    float s = 0.0f;
#pragma unroll
                    for (int j = 0; j < 32; j++) s += wv[j] * xr[j];
                    acc[r] += s;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        float s = acc[r];
        // Sum over the MM_TILE_BLOCKS lanes that share a weight row.
        for (int o = MM_TILE_BLOCKS / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (bi == 0 && row < n && r < rows) y[(size_t)(m0 + r) * n + row] = s;
    }
}

// One pair of entry points per block format: the row kernel and the tiled one.
#define MATMUL_ENTRY_POINTS(F, name)                                                          \
    extern "C" __global__ void matmul_tiled_##name(const u8* w, const float* x, float* y,     \
                                                   int m, int n, int k) {                     \
        matmul_tiled<F>(w, x, y, m, n, k);                                                    \
    }                                                                                         \
    extern "C" __global__ void matmul_##name(const u8* w, const float* x, float* y, int m,    \
                                             int n, int k) {                                  \
        matmul_blocks<F>(w, x, y, m, n, k);                                                   \
    }

MATMUL_ENTRY_POINTS(Q4_0, q4_0)
MATMUL_ENTRY_POINTS(Q4_1, q4_1)
MATMUL_ENTRY_POINTS(Q5_0, q5_0)
MATMUL_ENTRY_POINTS(Q8_0, q8_0)
MATMUL_ENTRY_POINTS(Q2_K, q2_k)
MATMUL_ENTRY_POINTS(Q3_K, q3_k)
MATMUL_ENTRY_POINTS(Q4_K, q4_k)
MATMUL_ENTRY_POINTS(Q5_K, q5_k)
MATMUL_ENTRY_POINTS(Q6_K, q6_k)

// W as f16 [n, k] (any k): the fallback for GGUF types without a block kernel here, which
// are dequantised to f16 once at load time.
extern "C" __global__ void matmul_f16(const u16* w, const float* x, float* y, int m, int n, int k) {
    int lane = threadIdx.x % WARP;
    int row = blockIdx.x * MM_WARPS + threadIdx.x / WARP;
    if (row >= n) return;
    int m0 = blockIdx.y * MM_ROWS;
    int rows = min(MM_ROWS, m - m0);
    const u16* wr = w + (size_t)row * k;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    for (int i = lane; i < k; i += WARP) {
        float wv = h2f(wr[i]);
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++)
            if (r < rows) acc[r] += wv * x[(size_t)(m0 + r) * k + i];
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < rows) y[(size_t)(m0 + r) * n + row] = s;
    }
}
