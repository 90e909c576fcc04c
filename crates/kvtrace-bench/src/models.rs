//! The model configurations a KV-cache benchmark run sizes its entries by: the nine models
//! MLPerf Storage's KV-cache benchmark knows, under the same `--model` names, so a run here
//! and a run there move the same bytes per token.

/// A model's KV geometry. Standard attention stores K and V for every KV head of every
/// layer; multi-head latent attention (MLA) stores one compressed latent plus the rotary
/// part per layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    pub name: &'static str,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub hidden: u64,
    pub head_dim: u64,
    pub dtype_bytes: u64,
    /// `(kv_lora_rank, qk_rope_head_dim)` for MLA models.
    pub mla: Option<(u64, u64)>,
}

impl ModelConfig {
    /// Bytes of KV cache one token occupies.
    pub fn bytes_per_token(&self) -> u64 {
        match self.mla {
            Some((rank, rope)) => self.layers * (rank + rope) * self.dtype_bytes,
            None => self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes,
        }
    }
}

const fn standard(
    name: &'static str,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    hidden: u64,
    head_dim: u64,
) -> ModelConfig {
    ModelConfig {
        name,
        layers,
        heads,
        kv_heads,
        hidden,
        head_dim,
        dtype_bytes: 2,
        mla: None,
    }
}

/// kv-cache.py's default model.
pub const DEFAULT_MODEL: ModelConfig = standard("llama3.1-8b", 32, 32, 8, 4096, 128);

/// Every model, fp16 KV.
pub const MODELS: [ModelConfig; 9] = [
    standard("tiny-1b", 12, 8, 4, 1024, 128),
    standard("mistral-7b", 32, 32, 8, 4096, 128),
    standard("llama2-7b", 32, 32, 32, 4096, 128),
    DEFAULT_MODEL,
    standard("llama3.1-70b-instruct", 80, 64, 8, 8192, 128),
    ModelConfig {
        mla: Some((512, 64)),
        ..standard("deepseek-v3", 61, 128, 128, 7168, 56)
    },
    standard("qwen3-32b", 64, 64, 8, 5120, 128),
    standard("gpt-oss-120b", 36, 64, 8, 2880, 64),
    standard("gpt-oss-20b", 24, 64, 8, 2880, 64),
];

/// The model called `name`, or a one-line error listing the names there are.
pub fn model(name: &str) -> Result<&'static ModelConfig, String> {
    MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        format!("unknown model {name:?}; known: {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_match_the_reference_table() {
        let expected = [
            ("tiny-1b", 24_576),
            ("mistral-7b", 131_072),
            ("llama2-7b", 524_288),
            ("llama3.1-8b", 131_072),
            ("llama3.1-70b-instruct", 327_680),
            ("deepseek-v3", 70_272),
            ("qwen3-32b", 262_144),
            ("gpt-oss-120b", 73_728),
            ("gpt-oss-20b", 49_152),
        ];
        for (name, bytes) in expected {
            assert_eq!(model(name).expect(name).bytes_per_token(), bytes, "{name}");
        }
        assert_eq!(MODELS.len(), expected.len());
    }

    #[test]
    fn an_unknown_model_names_the_known_ones() {
        let err = model("llama4").expect_err("unknown");
        assert!(
            err.contains("\"llama4\"") && err.contains("llama3.1-8b"),
            "{err}"
        );
    }
}
