//! CPU kernels for the forward pass: the default backend and the oracle for every other one.
