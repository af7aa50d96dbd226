use serde::{Deserialize, Serialize};

/// One entry of `/v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// Context window in tokens (an extension many servers add).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
}

/// `/v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

impl ModelList {
    /// Wraps cards in the list envelope.
    pub fn new(data: Vec<ModelCard>) -> Self {
        Self {
            object: "list".into(),
            data,
        }
    }
}
