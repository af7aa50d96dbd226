//! GGUF quantised weights: the ggml Q4_1 block format, Q8_1 activations, and the Q4_1 matmul.

pub mod dot;
pub mod matmul;
pub mod q4_1;
pub mod q8_1;
