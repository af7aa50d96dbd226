//! Where a forward batch's tokens go: positions, KV slots, and which rows produce logits.
//! Computed and checked once per forward pass, on the host, for every backend.

use super::error::ModelError;
use super::forward::ForwardBatch;
use super::weight::Weight;

/// The flat token layout of one [`ForwardBatch`].
pub(crate) struct BatchLayout {
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// KV cache slot (`block * block_size + offset`) of each token.
    pub slots: Vec<usize>,
    /// Index of each token's sequence in the batch.
    pub token_seq: Vec<usize>,
    /// Rows whose hidden state becomes logits (the last `num_logits` tokens of each
    /// sequence), in batch and position order.
    pub logit_rows: Vec<usize>,
}

impl BatchLayout {
    /// Lays out `batch` over a KV cache of `num_blocks` blocks of `block_size` tokens,
    /// refusing block tables that do not cover a token or name a block outside the cache.
    pub fn new(
        batch: &ForwardBatch<'_>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, ModelError> {
        let n = batch.num_tokens();
        let mut layout = Self {
            positions: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            token_seq: Vec::with_capacity(n),
            logit_rows: Vec::new(),
        };
        for (s, seq) in batch.seqs.iter().enumerate() {
            for j in 0..seq.tokens.len() {
                let pos = seq.start_pos + j;
                let block = *seq.block_table.get(pos / block_size).ok_or_else(|| {
                    ModelError::Kernel(format!(
                        "block table of {} blocks does not cover position {pos}",
                        seq.block_table.len()
                    ))
                })? as usize;
                if block >= num_blocks {
                    return Err(ModelError::Kernel(format!(
                        "block {block} is outside the KV storage of {num_blocks} blocks"
                    )));
                }
                layout.positions.push(pos);
                layout.slots.push(block * block_size + pos % block_size);
                layout.token_seq.push(s);
            }
            let end = layout.positions.len();
            let rows = seq.num_logits.min(seq.tokens.len());
            layout.logit_rows.extend(end - rows..end);
        }
        Ok(layout)
    }
}

/// The embedding rows of the batch's tokens, `[n_tokens, hidden]`.
pub(crate) fn embed(
    batch: &ForwardBatch<'_>,
    embedding: &Weight,
    vocab_size: usize,
    hidden: usize,
) -> Result<Vec<f32>, ModelError> {
    let mut x = vec![0f32; batch.num_tokens() * hidden];
    for (row, &tok) in x
        .chunks_mut(hidden)
        .zip(batch.seqs.iter().flat_map(|s| s.tokens.iter()))
    {
        if tok as usize >= vocab_size {
            return Err(ModelError::Kernel(format!(
                "token id {tok} is outside the vocabulary of {vocab_size}"
            )));
        }
        embedding.dequantize_row(tok as usize, row);
    }
    Ok(x)
}
