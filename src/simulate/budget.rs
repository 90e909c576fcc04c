//! The token budgets of one engine pass. vLLM and TRT-LLM spend one budget
//! (`max_num_batched_tokens`) on every scheduled token, decode included. SGLang spends its
//! chunk budget (`min(chunked_prefill_size, max_prefill_tokens)`) on prefill tokens only,
//! cuts chunks at page boundaries, and admits a request only while the memory left —
//! free and evictable tokens minus what running requests are expected to still generate
//! (`new_token_ratio` of their remaining output) — covers its chunk and, when its prompt
//! completes, its own output reserve.

use super::args::SglangArgs;

/// SGLang's estimate of the share of its remaining output a running request will still
/// generate: starts at 0.7 × conservativeness, falls linearly to 0.14 × conservativeness
/// over 600 passes, and jumps back when memory runs out (a retraction).
#[derive(Clone, Debug)]
pub struct NewTokenRatio {
    value: f64,
    init: f64,
    min: f64,
    step: f64,
}

const DECAY_PASSES: f64 = 600.0;

impl NewTokenRatio {
    pub fn new(conservativeness: f64) -> NewTokenRatio {
        let init = (0.7 * conservativeness).min(1.0);
        let min = (0.14 * conservativeness).min(init);
        NewTokenRatio {
            value: init,
            init,
            min,
            step: (init - min) / DECAY_PASSES,
        }
    }

    pub fn value(&self) -> f64 {
        self.value
    }

    /// One pass went by.
    pub fn decay(&mut self) {
        self.value = (self.value - self.step).max(self.min);
    }

    /// Memory ran out: be conservative again.
    pub fn reset(&mut self) {
        self.value = self.init;
    }
}

/// What a pass may still schedule.
#[derive(Clone, Debug)]
pub enum Budget {
    /// vLLM / TRT-LLM: tokens of any kind.
    Tokens(u64),
    Sglang {
        /// Prefill tokens left this pass.
        chunk: u64,
        page: u32,
        /// Tokens of KV memory left for new admissions.
        memory: f64,
        clip_max_new_tokens: u64,
    },
}

impl Budget {
    /// A pass's SGLang budget given the free and evictable KV tokens and the output still
    /// expected from running requests (already scaled by the ratio).
    pub fn sglang(args: &SglangArgs, page: u32, free_tokens: u64, reserved: f64) -> Budget {
        Budget::Sglang {
            chunk: args.chunked_prefill_size.min(args.max_prefill_tokens),
            page: page.max(1),
            memory: free_tokens as f64 - reserved,
            clip_max_new_tokens: args.clip_max_new_tokens,
        }
    }

    /// Whether nothing more can be scheduled this pass.
    pub fn exhausted(&self) -> bool {
        matches!(self, Budget::Tokens(0))
    }

    /// Tokens of a request's `remaining` ones it may compute now (`prefill`: they are
    /// prompt tokens). SGLang never limits decode tokens, and cuts a prompt that does not
    /// fit at a page boundary.
    pub fn take(&self, remaining: u32, prefill: bool) -> u32 {
        match *self {
            Budget::Tokens(t) => u64::from(remaining).min(t) as u32,
            Budget::Sglang { .. } if !prefill => remaining,
            Budget::Sglang { chunk, page, .. } => {
                if u64::from(remaining) <= chunk {
                    remaining
                } else {
                    (chunk / u64::from(page) * u64::from(page)) as u32
                }
            }
        }
    }

    /// Whether a new request may start with `take` prompt tokens: SGLang checks its memory
    /// for the page-rounded chunk plus, when the prompt completes, its clipped output.
    pub fn admits(&self, take: u32, completes: bool, output_left: u32) -> bool {
        match *self {
            Budget::Tokens(_) => true,
            Budget::Sglang { memory, .. } => self.charge(take, completes, output_left) <= memory,
        }
    }

    fn charge(&self, take: u32, completes: bool, output_left: u32) -> f64 {
        match *self {
            Budget::Tokens(_) => f64::from(take),
            Budget::Sglang {
                page,
                clip_max_new_tokens,
                ..
            } => {
                let input = take.div_ceil(page) * page;
                let reserve = if completes {
                    u64::from(output_left).min(clip_max_new_tokens)
                } else {
                    0
                };
                f64::from(input) + reserve as f64
            }
        }
    }

    /// Spends what a scheduled request took (`admitted`: a new request, which SGLang also
    /// charges against its memory).
    pub fn spend(&mut self, take: u32, prefill: bool, admitted: Option<(bool, u32)>) {
        let charge = admitted.map(|(completes, left)| self.charge(take, completes, left));
        match self {
            Budget::Tokens(t) => *t -= u64::from(take),
            Budget::Sglang { chunk, memory, .. } => {
                if prefill {
                    *chunk -= u64::from(take).min(*chunk);
                }
                if let Some(c) = charge {
                    *memory -= c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_decays_over_600_passes_and_resets() {
        let mut r = NewTokenRatio::new(1.0);
        assert_eq!(r.value(), 0.7);
        for _ in 0..300 {
            r.decay();
        }
        assert!((r.value() - 0.42).abs() < 1e-9, "halfway: {}", r.value());
        for _ in 0..1000 {
            r.decay();
        }
        assert!((r.value() - 0.14).abs() < 1e-12);
        r.reset();
        assert_eq!(r.value(), 0.7);
    }

    #[test]
    fn sglang_chunks_at_pages_and_charges_memory_with_the_output_reserve() {
        let args = SglangArgs {
            chunked_prefill_size: 1000,
            ..SglangArgs::default()
        };
        let mut b = Budget::sglang(&args, 16, 5000, 200.0);
        assert_eq!(b.take(3000, true), 992, "a chunk ends on a page boundary");
        assert_eq!(b.take(900, true), 900, "a prompt that fits is taken whole");
        assert_eq!(b.take(1, false), 1, "decode tokens are not budgeted");
        assert!(b.admits(900, true, 3000), "912 + 3000 <= 4800");
        assert!(
            !b.admits(900, true, 5000),
            "the reserve is clipped at 4096: 912 + 4096 > 4800"
        );
        b.spend(900, true, Some((true, 3000)));
        assert_eq!(b.take(500, true), 96, "100 chunk tokens left, cut to 96");
        assert!(b.admits(96, false, 0), "888 tokens of memory left");
        assert!(!b.admits(96, true, 1000), "96 + 1000 > 888");
    }
}
