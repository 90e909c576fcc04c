//! Request workloads for the serving simulation: sessions of turns, from a Mooncake trace
//! ([`crate::mooncake`]) or seeded and synthetic. Prompts stay compact — one content id per
//! trace block, never a token vector — so a 145 M-token trace costs a few megabytes.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The block size Mooncake traces are written with.
pub const DEFAULT_TRACE_BLOCK_SIZE: u32 = 512;

/// A prompt as runs of content: each [`Run`] stands for `tokens` identical tokens of content
/// `id`. A trace's prompt is one run per trace block (the last may be partial); a prompt
/// rebuilt from a session's history (`mooncake-delta`) joins runs of any length. Equal runs
/// at equal positions are reusable prefix KV, so a prompt costs a few bytes per block, never
/// a token vector.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub runs: Vec<Run>,
    pub len: u32,
}

/// `tokens` tokens of content `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub id: u32,
    pub tokens: u32,
}

impl Prompt {
    /// A prompt of `len` tokens cut into blocks of `block_tokens`, block `j` of content
    /// `ids[j]` (a missing id stands for content no other prompt has).
    pub fn from_blocks(ids: &[u32], block_tokens: u32, len: u32) -> Prompt {
        let block = block_tokens.max(1);
        let blocks = len.div_ceil(block) as usize;
        let runs = (0..blocks)
            .map(|j| Run {
                id: ids.get(j).copied().unwrap_or(u32::MAX),
                tokens: (len - j as u32 * block).min(block),
            })
            .collect();
        Prompt { runs, len }
    }

    /// This prompt followed by `runs`.
    pub fn extended(&self, runs: &[Run]) -> Prompt {
        let mut out = self.clone();
        for r in runs.iter().filter(|r| r.tokens > 0) {
            out.runs.push(*r);
            out.len = out.len.saturating_add(r.tokens);
        }
        out
    }

    /// Chained hashes of the full blocks of `block_size` tokens, split at the end of the
    /// prompt: the prompt's own, then those of the blocks `output` completes after it.
    pub fn block_hashes_with_output(&self, block_size: u32, output: Run) -> (Vec<u64>, Vec<u64>) {
        let mut hashes = self.extended(&[output]).block_hashes(block_size);
        let output = hashes.split_off((self.len / block_size.max(1)) as usize);
        (hashes, output)
    }

    /// The content ids, one per run.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().map(|r| r.id)
    }

    /// Chained hashes of the prompt's full blocks of `block_size` tokens: block `j`'s hash
    /// covers its content and every block before it, so equal hashes mean equal prefixes
    /// whatever the trace's own block size.
    pub fn block_hashes(&self, block_size: u32) -> Vec<u64> {
        let b = block_size.max(1);
        let full = self.len / b;
        let mut out = Vec::with_capacity(full as usize);
        let mut parent = 0u64;
        let mut pieces: Vec<u8> = Vec::with_capacity(24);
        let mut runs = self.runs.iter().copied();
        let mut current = runs.next();
        // Tokens of `current` already hashed into earlier blocks.
        let mut used = 0u32;
        for _ in 0..full {
            pieces.clear();
            let mut room = b;
            while room > 0 {
                let Some(run) = current else { break };
                let take = (run.tokens - used).min(room);
                pieces.extend_from_slice(&run.id.to_le_bytes());
                pieces.extend_from_slice(&take.to_le_bytes());
                room -= take;
                used += take;
                if used == run.tokens {
                    current = runs.next();
                    used = 0;
                }
            }
            parent = xxh3_64_with_seed(&pieces, parent);
            out.push(parent);
        }
        out
    }
}

/// One request of a session.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub prompt: Prompt,
    pub output_length: u32,
    /// The content of this turn's generated output when a later prompt of its session
    /// repeats it (`mooncake-delta`): the blocks it completes are then that prompt's blocks.
    pub output_content: Option<u32>,
    /// Milliseconds between the previous turn's completion and this turn (0 for the first).
    pub delay_ms: f64,
    pub request_id: Option<String>,
    /// The router queue's priority bump in seconds and its strict tier (engines ignore both).
    pub priority: i64,
    pub strict_priority: u64,
}

/// Turns that run one after another; a trace row without a session id is a session of one.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub id: Option<String>,
    /// Arrival of the first turn, in milliseconds from the start of the workload.
    pub start_ms: f64,
    pub turns: Vec<Turn>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub sessions: Vec<Session>,
    /// Sessions that wait for others (an agentic trace's request graph): `None` when every
    /// session starts at its own arrival.
    pub graph: Option<Graph>,
    /// Each request comes with its output tokens planned: trace files and session
    /// workloads do in Dynamo, flat synthetic requests do not. A disaggregated prefill
    /// worker then generates all of them (hidden) before it hands the request off, as
    /// Dynamo 1.4.2's does; otherwise one.
    pub planned_outputs: bool,
}

impl Workload {
    pub fn request_count(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Whether every start, inter-turn delay and graph wait is a finite time: a slow-down by
    /// a tiny ratio can carry one past the largest `f64`, where no event can be scheduled.
    pub fn times_are_finite(&self) -> bool {
        let sessions = self
            .sessions
            .iter()
            .all(|s| s.start_ms.is_finite() && s.turns.iter().all(|t| t.delay_ms.is_finite()));
        let waits = self
            .graph
            .iter()
            .flat_map(|g| g.waits.iter().flatten())
            .all(|w| w.delay_ms.is_finite());
        sessions && waits
    }

    /// Divides arrival times and inter-turn delays by `ratio` (trace replay faster or slower
    /// than recorded).
    pub fn speed_up_arrivals(&mut self, ratio: f64) {
        if ratio > 0.0 && ratio != 1.0 {
            for s in &mut self.sessions {
                s.start_ms /= ratio;
                for t in &mut s.turns {
                    t.delay_ms /= ratio;
                }
            }
            for waits in self.graph.iter_mut().flat_map(|g| g.waits.iter_mut()) {
                for w in waits {
                    w.delay_ms /= ratio;
                }
            }
        }
    }
}

/// The dependencies of an agentic workload, session by session (each of its sessions is one
/// request): a session with waits starts once every one of them has fired, and not before
/// its own `start_ms`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub waits: Vec<Vec<Wait>>,
    /// Each session's play (a *trajectory*: one agent run, whose span AISimulate reports),
    /// numbered from 0 (see `play_names`): the `play_id` a version 2 row names (a Weka
    /// session's object), or for legacy rows the connected part of the graph its waits join
    /// it to, as AISimulate reads them.
    pub plays: Vec<u32>,
    /// Each play's name, by number: its `play_id`, or `legacy-play:` and the id of its
    /// earliest request that waits for nothing. Plays are numbered in AISimulate's order:
    /// by `source_play_ordinal` when every play has one, else by name.
    pub play_names: Vec<String>,
    /// Its identity as AISimulate's report gives it, when read for AISimulate's engine.
    pub identity: Option<crate::agentic_identity::GraphIdentity>,
}

/// Session `on` must be dispatched or completed (`trigger`), then `delay_ms` pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Wait {
    pub on: u32,
    pub trigger: Trigger,
    pub delay_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The request was sent (a spawned sub-agent starts beside its parent).
    Dispatch,
    /// The request ended (its output is the next request's input).
    Completion,
}

/// How synthetic requests arrive when they are not driven by a concurrency limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SyntheticArrivals {
    /// All at time 0; a closed-loop concurrency limit releases them.
    Burst,
    /// Poisson arrivals at this many requests per second, from this seed.
    Rate { per_s: f64, seed: u64 },
    /// A constant gap in milliseconds (0 = all at once).
    Interval { ms: f64 },
}

impl SyntheticArrivals {
    /// The first turn's arrival of each of `count` sessions, in milliseconds. Gaps accumulate
    /// one after another, and a Poisson gap is `-mean · ln(1 - u)` of rand's `StdRng` uniform,
    /// as Dynamo's `ArrivalSpec::timestamps` draws them.
    fn timestamps(&self, count: u32) -> Vec<f64> {
        let (mean_gap, mut rng) = match *self {
            SyntheticArrivals::Burst => (0.0, None),
            SyntheticArrivals::Interval { ms } => (ms, None),
            SyntheticArrivals::Rate { per_s, seed } => {
                (1000.0 / per_s, Some(StdRng::seed_from_u64(seed)))
            }
        };
        let mut at = 0.0;
        (0..count)
            .map(|i| {
                if i > 0 {
                    at += match rng.as_mut() {
                        Some(rng) => exponential(mean_gap, rng),
                        None => mean_gap,
                    };
                }
                at
            })
            .collect()
    }
}

fn exponential(mean: f64, rng: &mut StdRng) -> f64 {
    if mean == 0.0 {
        return 0.0;
    }
    let u = (1.0 - rng.random::<f64>()).clamp(f64::MIN_POSITIVE, 1.0);
    -mean * u.ln()
}

/// A synthetic workload (reference §4.3). With one turn and no shared prefix every prompt
/// is unique; otherwise sessions of `turns` turns whose prompts start with
/// `round(ceil(isl / block) · shared_prefix_ratio)` blocks shared by the session's prefix
/// group. A turn does not extend the previous turn's context.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Requests (flat) or sessions.
    pub count: u32,
    pub turns: u32,
    pub shared_prefix_ratio: f64,
    pub prefix_groups: u32,
    pub inter_turn_delay_ms: f64,
    pub block_size: u32,
    pub arrivals: SyntheticArrivals,
    /// Picks each session's prefix group.
    pub seed: u64,
    /// A turn's prompt is the session's previous prompt, that turn's output and the turn's
    /// own input (AISimulate's `synthetic-session`), instead of a fresh prompt per turn
    /// (Dynamo 1.4.2's).
    pub carry_history: bool,
}

impl SyntheticSpec {
    /// About how many bytes the built workload, a run's records of it and the engines' KV
    /// blocks take, when the engines hold at most `engine_blocks` blocks in all: 600 a
    /// request (its turn, its record, its arrival), 64 a block of a turn's own input (its id
    /// and its entry in the interning table, which peaks at that while the table grows) and
    /// 96 a block an engine holds (its hash, its place in the pool's maps and lists).
    /// Measured on this build: a million one-block requests 622 MB; four prompts of 6.25 M
    /// blocks, all rejected, 966 MB, and of 62.5 M blocks 15 GB; four of 1.56 M blocks, all
    /// held, 792 MB. For refusing, before [`SyntheticSpec::build`] allocates, a workload that
    /// cannot fit in memory.
    pub fn footprint_bytes(&self, engine_blocks: u64) -> u64 {
        let requests = u64::from(self.count) * u64::from(self.turns.max(1));
        let blocks = u64::from(self.input_tokens.div_ceil(self.block_size.max(1)));
        let input_blocks = requests.saturating_mul(blocks);
        let held = input_blocks.min(engine_blocks);
        requests
            .saturating_mul(600)
            .saturating_add(input_blocks.saturating_mul(64))
            .saturating_add(held.saturating_mul(96))
    }

    /// Draws the workload as Dynamo 1.4.2's `SyntheticTraceSpec` does — one prefix group per
    /// session from rand's `StdRng` seeded with `seed`, fresh blocks numbered in order — so
    /// the same flags give the same requests in both tools. Ids are interned in first-seen
    /// order like a trace file's.
    pub fn build(&self) -> Workload {
        let block = self.block_size.max(1);
        let blocks = self.input_tokens.div_ceil(block);
        let shared = ((f64::from(blocks) * self.shared_prefix_ratio).round() as u32).min(blocks);
        let grouped = self.prefix_groups > 0 && self.shared_prefix_ratio > 0.0;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut interned: HashMap<u64, u32> = HashMap::new();
        let mut intern = |raw: u64| {
            let next = interned.len() as u32;
            *interned.entry(raw).or_insert(next)
        };
        let mut next_fresh = 1u64;
        let mut next_output = 0u64;
        let sessions = self
            .arrivals
            .timestamps(self.count)
            .into_iter()
            .enumerate()
            .map(|(i, start_ms)| {
                let group =
                    grouped.then(|| rng.random_range(0..self.prefix_groups as usize) as u64);
                let mut turns: Vec<Turn> = (0..self.turns.max(1))
                    .map(|t| {
                        let mut ids = Vec::with_capacity(blocks as usize);
                        if let Some(group) = group {
                            ids.extend(
                                (0..u64::from(shared))
                                    .map(|k| intern(GROUP_PREFIX_TAG | (group << 32) | k)),
                            );
                        }
                        while ids.len() < blocks as usize {
                            ids.push(intern(next_fresh));
                            next_fresh += 1;
                        }
                        Turn {
                            prompt: Prompt::from_blocks(&ids, block, self.input_tokens),
                            output_length: self.output_tokens.max(1),
                            output_content: None,
                            delay_ms: if t == 0 {
                                0.0
                            } else {
                                self.inter_turn_delay_ms
                            },
                            request_id: None,
                            priority: 0,
                            strict_priority: 0,
                        }
                    })
                    .collect();
                if self.carry_history {
                    for t in 1..turns.len() {
                        let output = Run {
                            id: intern(OUTPUT_TAG | next_output),
                            tokens: turns[t - 1].output_length,
                        };
                        next_output += 1;
                        turns[t - 1].output_content = Some(output.id);
                        let mut runs = vec![output];
                        runs.extend_from_slice(&turns[t].prompt.runs);
                        turns[t].prompt = turns[t - 1].prompt.extended(&runs);
                    }
                }
                Session {
                    id: (self.turns > 1).then(|| format!("session-{i}")),
                    start_ms,
                    turns,
                }
            })
            .collect();
        Workload {
            sessions,
            graph: None,
            planned_outputs: self.turns > 1
                || self.shared_prefix_ratio > 0.0
                || self.prefix_groups > 0
                || self.inter_turn_delay_ms > 0.0,
        }
    }
}

/// Marks a prefix group's block ids apart from the fresh ones (which count up from 1).
const GROUP_PREFIX_TAG: u64 = 0xD00D_0000_0000_0000;
/// Marks the content of a turn's output (a session carrying its history).
const OUTPUT_TAG: u64 = 0xF0A7_0000_0000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_hashes_follow_content_across_block_sizes() {
        let p = |ids: Vec<u32>, len| Prompt::from_blocks(&ids, 512, len);
        let a = p(vec![0, 1, 2], 1500).block_hashes(64);
        let b = p(vec![0, 1, 5], 1500).block_hashes(64);
        assert_eq!(a.len(), 23, "full 64-token blocks only");
        assert_eq!(a[..16], b[..16], "shared two trace blocks");
        assert_ne!(a[16], b[16]);
        assert_ne!(a[0], a[1], "equal content, different position");
        let odd = p(vec![0, 1], 1024).block_hashes(300);
        assert_eq!(odd.len(), 3);
    }

    #[test]
    fn an_output_completes_the_blocks_the_next_prompt_repeats() {
        // 100 prompt tokens, 30 generated, then 50 new ones, in blocks of 16.
        let first = Prompt::from_blocks(&[1, 2], 64, 100);
        let output = Run { id: 9, tokens: 30 };
        let next = first.extended(&[output, Run { id: 3, tokens: 50 }]);
        assert_eq!(next.len, 180);
        let (prompt, generated) = first.block_hashes_with_output(16, output);
        assert_eq!(prompt, first.block_hashes(16), "6 full prompt blocks");
        assert_eq!(generated.len(), 2, "tokens 96..128 complete two more");
        let all = next.block_hashes(16);
        assert_eq!(all[..6], prompt[..]);
        assert_eq!(all[6..8], generated[..]);
        let other = first
            .block_hashes_with_output(16, Run { id: 10, tokens: 30 })
            .1;
        assert_ne!(other, generated, "another output is other content");
    }

    #[test]
    fn synthetic_sessions_share_group_prefixes_and_are_seeded() {
        let spec = SyntheticSpec {
            input_tokens: 1000,
            output_tokens: 10,
            count: 20,
            turns: 3,
            shared_prefix_ratio: 0.5,
            prefix_groups: 2,
            inter_turn_delay_ms: 5.0,
            block_size: 100,
            arrivals: SyntheticArrivals::Rate {
                per_s: 10.0,
                seed: 42,
            },
            seed: 42,
            carry_history: false,
        };
        let w = spec.build();
        assert_eq!(w.request_count(), 60);
        let first: Vec<u32> = w.sessions[0].turns[0].prompt.ids().collect();
        assert_eq!(first.len(), 10);
        assert!(first[..5].iter().all(|&id| id < 10), "group prefix ids");
        assert!(w.sessions[1].start_ms > 0.0);
        assert_eq!(w, spec.build(), "same seed, same workload");
    }
}
