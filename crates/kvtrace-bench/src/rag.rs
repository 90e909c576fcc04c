//! Retrieval-augmented requests (`--enable-rag`): a corpus of documents whose KV is
//! ingested chunk by chunk (512 tokens each) when the run starts, and requests that, one in
//! ten, read the KV of the top 5 chunks of a document before their own prefill. Which
//! requests retrieve, which document and which chunks are drawn from the seed and the
//! request's identity, so a seed gives the same retrievals every run.

use kvtrace_io::rng::SplitMix64;

/// Tokens per document chunk.
pub const CHUNK_TOKENS: u64 = 512;
/// Chunks a retrieval reads.
pub const TOP_K: usize = 5;
/// Share of requests that retrieve.
const RETRIEVAL_SHARE: f64 = 0.1;

/// The documents: their sizes in tokens, drawn from the seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Corpus {
    pub doc_tokens: Vec<u64>,
}

impl Corpus {
    /// `docs` documents of 4,000–12,000 tokens, or 1,024–4,096 for large models (hidden
    /// size ≥ 8,192 or ≥ 64 layers), whose entries would otherwise be huge.
    pub fn new(seed: u64, docs: u32, large_model: bool) -> Corpus {
        let mut rng = SplitMix64::new(seed ^ 0x7261_6763_6f72_7075);
        let (lo, hi) = if large_model {
            (1024, 4096)
        } else {
            (4000, 12_000)
        };
        Corpus {
            doc_tokens: (0..docs).map(|_| rng.range(lo, hi)).collect(),
        }
    }

    /// `(document, chunk, tokens)` of every chunk, for ingestion.
    pub fn chunks(&self) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        self.doc_tokens.iter().enumerate().flat_map(|(d, &t)| {
            (0..t.div_ceil(CHUNK_TOKENS))
                .map(move |c| (d, c, (t - c * CHUNK_TOKENS).min(CHUNK_TOKENS)))
        })
    }

    /// The chunks request `(user, conversation, turn)` retrieves, if it retrieves: one
    /// document, `TOP_K` distinct chunks favouring the first ones (Zipf, weight 1/rank).
    pub fn retrieval(&self, seed: u64, request: [u64; 3]) -> Option<(usize, Vec<u64>)> {
        if self.doc_tokens.is_empty() {
            return None;
        }
        let mut rng = SplitMix64::new(
            seed ^ request[0].rotate_left(40) ^ request[1].rotate_left(20) ^ request[2],
        );
        rng.next_u64();
        if rng.next_f64() >= RETRIEVAL_SHARE {
            return None;
        }
        let doc = rng.range(0, self.doc_tokens.len() as u64 - 1) as usize;
        let n = self.doc_tokens[doc].div_ceil(CHUNK_TOKENS);
        let weights: Vec<f64> = (1..=n).map(|i| 1.0 / i as f64).collect();
        let mut picked = Vec::new();
        while picked.len() < TOP_K.min(n as usize) {
            let total: f64 = (0..n)
                .filter(|c| !picked.contains(c))
                .map(|c| weights[c as usize])
                .sum();
            let mut x = rng.next_f64() * total;
            for c in (0..n).filter(|c| !picked.contains(c)) {
                x -= weights[c as usize];
                if x <= 0.0 {
                    picked.push(c);
                    break;
                }
            }
            if x > 0.0 {
                let last = (0..n)
                    .rev()
                    .find(|c| !picked.contains(c))
                    .expect("a chunk left");
                picked.push(last);
            }
        }
        Some((doc, picked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrievals_are_a_tenth_of_requests_favour_early_chunks_and_repeat_by_seed() {
        let corpus = Corpus::new(4, 10, false);
        assert!(corpus
            .doc_tokens
            .iter()
            .all(|&t| (4000..=12_000).contains(&t)));
        let total: u64 = corpus.doc_tokens.iter().sum();
        assert_eq!(corpus.chunks().map(|c| c.2).sum::<u64>(), total);
        let mut hits = 0;
        let mut first_chunk = 0;
        for i in 0..10_000u64 {
            if let Some((_, chunks)) = corpus.retrieval(4, [i % 7, i, 1]) {
                hits += 1;
                assert_eq!(chunks.len(), TOP_K);
                let mut sorted = chunks.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), TOP_K, "distinct chunks");
                first_chunk += usize::from(chunks.contains(&0));
            }
        }
        assert!((900..1100).contains(&hits), "{hits}");
        assert!(first_chunk * 2 > hits, "chunk 0 is in most retrievals");
        assert_eq!(
            corpus.retrieval(4, [1, 2, 3]),
            corpus.retrieval(4, [1, 2, 3])
        );
    }
}
