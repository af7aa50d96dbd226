//! The OpenAI-compatible wire protocol shared by the runtime's direct server and the gateway:
//! request and response bodies, request validation, and OpenAI-style error bodies.

pub mod chat;
pub mod completion;
pub mod error;
pub mod job;
pub mod models;
pub mod number;
pub mod params;
pub mod render;
pub mod usage;

pub use error::ApiError;
