/* ggml's reference quantisers as a program, for kernels/src/quant/tests_quantize.rs
 * (`matches_ggml_reference_quantisers`): reads f32 values on stdin and writes
 * `quantize_row_<type>_ref` of them on stdout, the type (q4_0, ..., q6_k) its one argument.
 * Built around llama.cpp's ggml-quants.c by scripts/ggml-oracle.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml-quants.h"
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    size_t cap = 1 << 20, n = 0;
    float *x = malloc(cap * sizeof(float));
    size_t got;
    while ((got = fread(x + n, sizeof(float), cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) { cap *= 2; x = realloc(x, cap * sizeof(float)); }
    }
    const char *t = argv[1];
    size_t bytes; void *out;
#define RUN(arg, fn, block, qk) if (!strcmp(t, arg)) { bytes = n / qk * sizeof(block); out = malloc(bytes); fn(x, out, n); fwrite(out, 1, bytes, stdout); return 0; }
    RUN("q4_0", quantize_row_q4_0_ref, block_q4_0, QK4_0)
    RUN("q4_1", quantize_row_q4_1_ref, block_q4_1, QK4_1)
    RUN("q5_0", quantize_row_q5_0_ref, block_q5_0, QK5_0)
    RUN("q8_0", quantize_row_q8_0_ref, block_q8_0, QK8_0)
    RUN("q2_k", quantize_row_q2_K_ref, block_q2_K, QK_K)
    RUN("q3_k", quantize_row_q3_K_ref, block_q3_K, QK_K)
    RUN("q4_k", quantize_row_q4_K_ref, block_q4_K, QK_K)
    RUN("q5_k", quantize_row_q5_K_ref, block_q5_K, QK_K)
    RUN("q6_k", quantize_row_q6_K_ref, block_q6_K, QK_K)
    return 1;
}
/* ggml-quants.c's only dependencies outside itself (ggml.c is not linked). */
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d: %s\n", file, line, fmt);
    abort();
}
