//! Opening a GPU: driver context, one stream, and the kernel module compiled by NVRTC.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, ValidAsZeroBits,
};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::{GPU_BLOCK_TYPES, KERNEL_SOURCE};
use crate::QuantType;

/// Why a GPU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda` (the NVIDIA driver) could not be loaded.
    #[error("no CUDA driver: libcuda.so could not be loaded (is an NVIDIA driver installed?)")]
    NoDriver,
    /// `libnvrtc` could not be loaded.
    #[error(
        "no NVRTC: libnvrtc.so could not be loaded (install the CUDA runtime compiler, e.g. \
         the `nvidia-cuda-nvrtc` wheel, and add its lib folder to LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// NVRTC rejected the kernel source.
    #[error("compiling the CUDA kernels: {0}")]
    Compile(String),
    /// Buffers whose sizes do not fit the operation (a caller bug, caught before launch).
    #[error("{0}")]
    Shape(String),
}

/// Whether `libnvrtc` can be loaded (then [`compile_kernels`] works, GPU or not).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Compiles [`KERNEL_SOURCE`] to PTX for `arch` (e.g. `compute_90`; NVRTC's default when
/// `None`). Needs only `libnvrtc`, no GPU.
pub fn compile_kernels(arch: Option<&'static str>) -> Result<Ptx, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let options = CompileOptions {
        arch,
        // IEEE division and square roots: the CPU oracle uses them, and they are not where
        // the time goes.
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        name: Some("tidal_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, options)
        .map_err(|e| CudaError::Compile(compile_error_text(e)))
}

fn compile_error_text(e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

/// NVRTC's `--gpu-architecture` value for a compute capability.
fn arch_for(major: i32, minor: i32) -> &'static str {
    // NVRTC wants a &'static str; the known capabilities are few.
    match (major, minor) {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // Unknown: PTX for the oldest supported target, which the driver JIT-compiles.
        _ => "compute_75",
    }
}

/// The kernels of one module.
pub(crate) struct Functions {
    pub rms_norm: CudaFunction,
    pub rms_norm_in_place: CudaFunction,
    pub silu_mul: CudaFunction,
    pub gelu_mul: CudaFunction,
    pub add_into: CudaFunction,
    pub add_bias: CudaFunction,
    pub gather_rows: CudaFunction,
    pub rope: CudaFunction,
    pub write_kv_f32: CudaFunction,
    pub write_kv_f16: CudaFunction,
    pub write_kv_int8: CudaFunction,
    pub attention_f32: CudaFunction,
    pub attention_f16: CudaFunction,
    pub attention_int8: CudaFunction,
    pub matmul_f16: CudaFunction,
    /// Per block type (in [`crate::cuda::GPU_BLOCK_TYPES`] order): the row kernel and the
    /// tiled one (`matmul_<type>`, `matmul_tiled_<type>`).
    pub matmul_blocks: Vec<(QuantType, CudaFunction, CudaFunction)>,
}

/// Name, free and total bytes of GPU `ordinal`, without compiling the kernels: what the
/// runtime's memory plan checks before it uploads anything. The free figure is taken after
/// this process's context exists, so the context's own memory is already counted.
pub fn device_memory(ordinal: usize) -> Result<(String, usize, usize), CudaError> {
    if !driver_available() {
        return Err(CudaError::NoDriver);
    }
    let ctx = CudaContext::new(ordinal)?;
    let (free, total) = ctx.mem_get_info()?;
    Ok((ctx.name()?, free, total))
}

/// One GPU: its context, the stream every operation is queued on, and the compiled kernels.
/// Operations are asynchronous; [`Gpu::download`] and [`Gpu::synchronize`] wait.
pub struct Gpu {
    stream: Arc<CudaStream>,
    pub(crate) functions: Functions,
    name: String,
    capability: (i32, i32),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("name", &self.name)
            .field("capability", &self.capability)
            .finish()
    }
}

impl Gpu {
    /// Opens GPU `ordinal` and compiles the kernels for it.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, CudaError> {
        if !driver_available() {
            return Err(CudaError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        let capability = ctx.compute_capability()?;
        let name = ctx.name()?;
        let ptx = compile_kernels(Some(arch_for(capability.0, capability.1)))?;
        let module = ctx.load_module(ptx)?;
        let f = |name: &str| module.load_function(name);
        let functions = Functions {
            rms_norm: f("rms_norm")?,
            rms_norm_in_place: f("rms_norm_in_place")?,
            silu_mul: f("silu_mul")?,
            gelu_mul: f("gelu_mul")?,
            add_into: f("add_into")?,
            add_bias: f("add_bias")?,
            gather_rows: f("gather_rows")?,
            rope: f("rope")?,
            write_kv_f32: f("write_kv_f32")?,
            write_kv_f16: f("write_kv_f16")?,
            write_kv_int8: f("write_kv_int8")?,
            attention_f32: f("paged_attention_f32")?,
            attention_f16: f("paged_attention_f16")?,
            attention_int8: f("paged_attention_int8")?,
            matmul_f16: f("matmul_f16")?,
            matmul_blocks: GPU_BLOCK_TYPES
                .iter()
                .map(|&ty| {
                    let name = format!("{ty:?}").to_lowercase();
                    Ok((
                        ty,
                        f(&format!("matmul_{name}"))?,
                        f(&format!("matmul_tiled_{name}"))?,
                    ))
                })
                .collect::<Result<_, CudaError>>()?,
        };
        tracing::info!(
            gpu = %name,
            capability = format!("{}.{}", capability.0, capability.1),
            "CUDA kernels compiled"
        );
        Ok(Arc::new(Self {
            stream: ctx.default_stream(),
            functions,
            name,
            capability,
        }))
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// (free, total) bytes of device memory.
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.stream.context().mem_get_info()?)
    }

    /// The stream every operation of this GPU runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies `host` into a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// A zeroed device buffer of `len` values.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.alloc_zeros(len)?)
    }

    /// Waits for the queued work and copies `buffer` to the host.
    pub fn download<T: DeviceRepr>(&self, buffer: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        Ok(self.stream.clone_dtoh(buffer)?)
    }

    /// Waits until every queued operation has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }
}
