//! Loading a GGUF model into a running engine: the library form of `tidal runtime --model`,
//! so that the CLI, the benchmarks and `tidal up`'s in-process fleet load models the same
//! way. Loading blocks (it maps the file and prepares the weights): call it from a blocking
//! thread in async code. Unloading is dropping the result: the engine thread stops and
//! frees its KV memory once every [`Engine`] handle is gone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tidal_tokenizer::{ChatTemplate, ChatTemplateError, Tokenizer, TokenizerError};

use crate::engine::{Engine, EngineConfig, EngineError};
use crate::memory::{self, gib, DoesNotFit, MemoryPlan};
use crate::model::{Model, ModelError, ModelFile, QuantizeTo};
use crate::server::LoadedModel;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read as a GGUF model.
    #[error("loading {path}: {source}")]
    File {
        /// The model file.
        path: PathBuf,
        /// What went wrong.
        source: ModelError,
    },
    /// The GGUF metadata holds no usable tokenizer.
    #[error("building the tokenizer from GGUF metadata: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The model's chat template does not compile.
    #[error("compiling the model's chat template: {0}")]
    ChatTemplate(ChatTemplateError),
    /// The weights could not be loaded (unsupported architecture or tensor type).
    #[error("loading model weights: {0}")]
    Weights(ModelError),
    /// The engine refused the settings (e.g. a KV cache too small for one block).
    #[error("starting the engine: {0}")]
    Engine(#[from] EngineError),
    /// The memory plan exceeds what the device has: nothing was loaded.
    #[error("{0}")]
    DoesNotFit(Box<DoesNotFit>),
}

/// A model running in an engine, ready for requests.
pub struct Loaded {
    /// The engine (cheap to clone; the engine stops when every handle is gone).
    pub engine: Engine,
    /// `None` when the GGUF has no `tokenizer.chat_template` (chat requests get a 400).
    pub chat_template: Option<ChatTemplate>,
    /// Wall-clock seconds from opening the file to a running engine.
    pub load_seconds: f64,
}

impl Loaded {
    /// The form the HTTP server and the queue worker take.
    pub fn into_model(self) -> LoadedModel {
        LoadedModel {
            engine: self.engine,
            chat_template: self.chat_template,
        }
    }
}

/// Maps the GGUF at `path`, builds its tokenizer and chat template, loads the weights
/// (re-quantised to `quantize` if given) and starts an engine with `config`.
pub fn load_model(
    path: &Path,
    config: EngineConfig,
    quantize: Option<QuantizeTo>,
) -> Result<Loaded, LoadError> {
    let started = Instant::now();
    let file = ModelFile::open(path).map_err(|source| LoadError::File {
        path: path.to_owned(),
        source,
    })?;
    check_memory(&file, &config, quantize)?;
    // it fits: start reading it all while the rest of the load runs
    file.read_ahead();
    let tokenizer = Tokenizer::from_gguf(file.content())?;
    let chat_template = match ChatTemplate::from_gguf(file.content()) {
        Ok(t) => Some(t),
        Err(ChatTemplateError::Missing) => {
            tracing::warn!("the model has no chat template: chat requests will get a 400");
            None
        }
        Err(e) => return Err(LoadError::ChatTemplate(e)),
    };
    let model = Model::load(&file, quantize).map_err(LoadError::Weights)?;
    let engine = Engine::start(model, Arc::new(tokenizer), config)?;
    let load_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        model = %path.display(),
        seconds = format!("{load_seconds:.3}"),
        "model ready"
    );
    Ok(Loaded {
        engine,
        chat_template,
        load_seconds,
    })
}

/// The memory plan of `file` with `config`, checked against `config.device_memory` or what
/// the device has free: [`LoadError::DoesNotFit`] before anything is read or allocated. When
/// the device cannot say (no `/proc/meminfo`, a build without CUDA) the load goes on
/// unchecked, as it would without a plan.
fn check_memory(
    file: &ModelFile,
    config: &EngineConfig,
    quantize: Option<QuantizeTo>,
) -> Result<(), LoadError> {
    let plan = MemoryPlan::for_file(file, config, quantize).map_err(LoadError::Weights)?;
    let available = match memory::available_for(config) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, total = %gib(plan.total()), "memory plan not checked");
            return Ok(());
        }
    };
    let spare = plan.check(&available).map_err(LoadError::DoesNotFit)?;
    tracing::info!(
        device = %config.device,
        weights = %gib(plan.weights),
        kv_cache = %gib(plan.kv_cache),
        activations = %gib(plan.activations),
        total = %gib(plan.total()),
        spare = %gib(spare),
        "memory plan fits"
    );
    Ok(())
}
