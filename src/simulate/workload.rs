//! Request workloads for the serving simulation: Mooncake-style JSONL traces and seeded
//! synthetic ones. Prompts stay compact — one content id per trace block, never a token
//! vector — so a 145 M-token trace costs a few megabytes.

use crate::limits::{LineLimit, MAX_HASH_IDS_PER_ROW, MAX_LINE_BYTES};
use std::collections::HashMap;
use std::io::BufRead;

use serde_json::Value as Json;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{Error, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The block size Mooncake traces are written with.
pub const DEFAULT_TRACE_BLOCK_SIZE: u32 = 512;

/// A prompt as a sequence of content ids, each standing for `block_tokens` identical tokens
/// (the last block may be partial). Equal ids at equal positions are reusable prefix KV.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub block_tokens: u32,
    pub len: u32,
}

impl Prompt {
    /// Chained hashes of the prompt's full blocks of `block_size` tokens: block `j`'s hash
    /// covers its content and every block before it, so equal hashes mean equal prefixes
    /// whatever the trace's own block size.
    pub fn block_hashes(&self, block_size: u32) -> Vec<u64> {
        let (b, t) = (
            u64::from(block_size.max(1)),
            u64::from(self.block_tokens.max(1)),
        );
        let full = u64::from(self.len) / b;
        let mut out = Vec::with_capacity(full as usize);
        let mut parent = 0u64;
        let mut runs: Vec<u8> = Vec::with_capacity(24);
        for j in 0..full {
            let (start, end) = (j * b, (j + 1) * b);
            runs.clear();
            let mut pos = start;
            while pos < end {
                let block = pos / t;
                let stop = ((block + 1) * t).min(end);
                let id = self.ids.get(block as usize).copied().unwrap_or(u32::MAX);
                runs.extend_from_slice(&id.to_le_bytes());
                runs.extend_from_slice(&((stop - pos) as u32).to_le_bytes());
                pos = stop;
            }
            parent = xxh3_64_with_seed(&runs, parent);
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
        }
    }
}

/// Reads a Mooncake-style JSONL trace. Hash ids are interned in first-seen order; the first
/// arrival becomes time 0.
pub fn read_mooncake(src: impl BufRead, trace_block_size: u32) -> Result<Workload> {
    let mut interned: HashMap<u64, u32> = HashMap::new();
    let mut sessions: Vec<Session> = Vec::new();
    let mut by_id: HashMap<String, (usize, f64)> = HashMap::new();
    let mut last_timestamp = 0.0f64;
    for_each_row(src, |number, row| {
        let turn = row.turn(number, trace_block_size, &mut interned)?;
        let timestamp = row.timestamp.unwrap_or(last_timestamp);
        last_timestamp = timestamp;
        match row.session_id {
            Some(id) => match by_id.get_mut(&id) {
                Some((at, previous)) => {
                    let delay = row.delay.unwrap_or((timestamp - *previous).max(0.0));
                    *previous = timestamp;
                    sessions[*at].turns.push(Turn {
                        delay_ms: delay,
                        ..turn
                    });
                }
                None => {
                    if row.delay.is_some() {
                        return Err(Error::line(
                            number,
                            "delay",
                            "the first turn of a session cannot carry a delay",
                        ));
                    }
                    by_id.insert(id.clone(), (sessions.len(), timestamp));
                    sessions.push(Session {
                        id: Some(id),
                        start_ms: timestamp,
                        turns: vec![turn],
                    });
                }
            },
            None => sessions.push(Session {
                id: None,
                start_ms: timestamp,
                turns: vec![turn],
            }),
        }
        Ok(())
    })?;
    let origin = sessions
        .iter()
        .map(|s| s.start_ms)
        .fold(f64::INFINITY, f64::min);
    for s in &mut sessions {
        s.start_ms -= origin;
    }
    Ok(Workload {
        sessions,
        planned_outputs: true,
    })
}

/// Reads only the hash ids of a Mooncake-style JSONL trace's rows, in file order, each row
/// checked as [`read_mooncake`] checks it.
pub fn read_mooncake_hash_ids(src: impl BufRead) -> Result<Vec<Vec<u64>>> {
    let mut requests = Vec::new();
    for_each_row(src, |_, row| {
        requests.push(row.hash_ids);
        Ok(())
    })?;
    Ok(requests)
}

/// Parses every non-blank line into a [`Row`] and hands it on with its line number.
fn for_each_row(src: impl BufRead, mut f: impl FnMut(u64, Row) -> Result<()>) -> Result<()> {
    let src = std::io::BufReader::new(LineLimit::new(src, MAX_LINE_BYTES));
    for (index, line) in src.lines().enumerate() {
        let number = index as u64 + 1;
        let line = line.map_err(|e| Error::io(format!("read failed at line {number}"), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let row: Json = serde_json::from_str(&line)
            .map_err(|e| Error::line(number, "json", format!("not a JSON object: {e}")))?;
        f(number, Row::parse(&row, number)?)?;
    }
    Ok(())
}

/// The fields of one trace row, with their aliases.
struct Row {
    timestamp: Option<f64>,
    input_length: Option<u64>,
    output_length: u64,
    hash_ids: Vec<u64>,
    session_id: Option<String>,
    delay: Option<f64>,
    request_id: Option<String>,
    priority: i64,
    strict_priority: u64,
}

fn field<'a>(row: &'a Json, names: &[&'static str]) -> Option<(&'static str, &'a Json)> {
    names
        .iter()
        .find_map(|&n| row.get(n).filter(|v| !v.is_null()).map(|v| (n, v)))
}

impl Row {
    fn parse(row: &Json, line: u64) -> Result<Row> {
        if !row.is_object() {
            return Err(Error::line(
                line,
                "json",
                "expected one JSON object per line",
            ));
        }
        let wrong =
            |name: &str, expected: &str| Error::line(line, name, format!("expected {expected}"));
        let number = |names: &[&'static str]| -> Result<Option<f64>> {
            field(row, names)
                .map(|(n, v)| {
                    v.as_f64()
                        .filter(|x| x.is_finite() && *x >= 0.0)
                        .ok_or_else(|| wrong(n, "a non-negative number of milliseconds"))
                })
                .transpose()
        };
        let count = |names: &[&'static str]| -> Result<Option<u64>> {
            field(row, names)
                .map(|(n, v)| {
                    v.as_u64()
                        .filter(|&x| x <= u64::from(u32::MAX))
                        .ok_or_else(|| wrong(n, "a non-negative integer token count"))
                })
                .transpose()
        };
        let text = |name: &'static str| -> Result<Option<String>> {
            field(row, &[name])
                .map(|(n, v)| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| wrong(n, "a JSON string"))
                })
                .transpose()
        };
        let hash_ids = match row.get("hash_ids") {
            None | Some(Json::Null) => {
                return Err(Error::line(line, "hash_ids", "missing field"));
            }
            Some(Json::Array(ids)) if ids.len() > MAX_HASH_IDS_PER_ROW => {
                return Err(Error::line(
                    line,
                    "hash_ids",
                    format!(
                        "{} ids: more than the {MAX_HASH_IDS_PER_ROW} one request may name",
                        ids.len()
                    ),
                ));
            }
            Some(Json::Array(ids)) => ids
                .iter()
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| wrong("hash_ids", "an array of non-negative integers"))
                })
                .collect::<Result<Vec<u64>>>()?,
            Some(_) => return Err(wrong("hash_ids", "an array of non-negative integers")),
        };
        let output_length = count(&["output_length", "output_tokens"])?
            .ok_or_else(|| Error::line(line, "output_length", "missing field"))?;
        Ok(Row {
            timestamp: number(&["timestamp", "created_time"])?,
            input_length: count(&["input_length", "input_tokens"])?,
            output_length,
            hash_ids,
            session_id: text("session_id")?,
            delay: number(&["delay", "delay_ms"])?,
            request_id: text("request_id")?,
            priority: match field(row, &["priority"]) {
                None => 0,
                Some((n, v)) => v.as_i64().ok_or_else(|| wrong(n, "an integer"))?,
            },
            strict_priority: count(&["strict_priority"])?.unwrap_or(0),
        })
    }

    /// The row's request. A prompt longer than its hash ids cover is an error (the trace was
    /// written with another block size); ids beyond the prompt are ignored.
    fn turn(&self, line: u64, block: u32, interned: &mut HashMap<u64, u32>) -> Result<Turn> {
        let capacity = self.hash_ids.len() as u64 * u64::from(block);
        let len = self.input_length.unwrap_or(capacity);
        if len == 0 {
            let field = if self.input_length.is_some() {
                "input_length"
            } else {
                "hash_ids"
            };
            return Err(Error::line(
                line,
                field,
                "a request needs at least one prompt token",
            ));
        }
        if len > capacity {
            return Err(Error::line(
                line,
                "hash_ids",
                format!(
                    "{} ids of {block} tokens cover {capacity} tokens but input_length is {len}; \
                     give the trace's block size with --trace-block-size",
                    self.hash_ids.len()
                ),
            ));
        }
        let used = len.div_ceil(u64::from(block.max(1))) as usize;
        let ids = self.hash_ids[..used]
            .iter()
            .map(|&h| {
                let next = interned.len() as u32;
                *interned.entry(h).or_insert(next)
            })
            .collect();
        Ok(Turn {
            prompt: Prompt {
                ids,
                block_tokens: block,
                len: len as u32,
            },
            output_length: self.output_length as u32,
            delay_ms: 0.0,
            request_id: self.request_id.clone(),
            priority: self.priority,
            strict_priority: self.strict_priority,
        })
    }
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
}

impl SyntheticSpec {
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
        let sessions = self
            .arrivals
            .timestamps(self.count)
            .into_iter()
            .enumerate()
            .map(|(i, start_ms)| {
                let group =
                    grouped.then(|| rng.random_range(0..self.prefix_groups as usize) as u64);
                let turns = (0..self.turns.max(1))
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
                            prompt: Prompt {
                                ids,
                                block_tokens: block,
                                len: self.input_tokens,
                            },
                            output_length: self.output_tokens.max(1),
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
                Session {
                    id: (self.turns > 1).then(|| format!("session-{i}")),
                    start_ms,
                    turns,
                }
            })
            .collect();
        Workload {
            sessions,
            planned_outputs: self.turns > 1
                || self.shared_prefix_ratio > 0.0
                || self.prefix_groups > 0
                || self.inter_turn_delay_ms > 0.0,
        }
    }
}

/// Marks a prefix group's block ids apart from the fresh ones (which count up from 1).
const GROUP_PREFIX_TAG: u64 = 0xD00D_0000_0000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Workload> {
        read_mooncake(text.as_bytes(), 512)
    }

    #[test]
    fn rows_become_sessions_with_interned_ids_and_aliases() {
        let w = parse(
            "{\"timestamp\": 500, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [7, 9]}\n\
             {\"created_time\": 700, \"input_tokens\": 10, \"output_tokens\": 2, \"hash_ids\": [9, 3], \"session_id\": \"s\"}\n\
             {\"timestamp\": 900, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [3], \"session_id\": \"s\"}\n\
             {\"timestamp\": 950, \"output_length\": 2, \"hash_ids\": [3], \"session_id\": \"s\", \"delay_ms\": 40}\n",
        )
        .expect("parse");
        assert_eq!(w.sessions.len(), 2);
        assert_eq!(w.sessions[0].start_ms, 0.0, "first arrival is time 0");
        assert_eq!(w.sessions[0].turns[0].prompt.ids, [0, 1]);
        let s = &w.sessions[1];
        assert_eq!(s.start_ms, 200.0);
        assert_eq!(
            s.turns[0].prompt.ids,
            [1],
            "ids beyond the prompt are dropped"
        );
        assert_eq!(s.turns[1].delay_ms, 200.0, "timestamp delta");
        assert_eq!(s.turns[2].delay_ms, 40.0, "explicit delay");
        assert_eq!(
            s.turns[2].prompt.len, 512,
            "input length defaults to capacity"
        );
    }

    #[test]
    fn bad_rows_name_their_line_and_field() {
        let cases = [
            ("{\"output_length\": 1}", "line 1: hash_ids: missing field"),
            (
                "\n{\"hash_ids\": [1], \"output_length\": \"x\"}",
                "line 2: output_length: expected",
            ),
            (
                "{\"hash_ids\": [1], \"input_length\": 600, \"output_length\": 1}",
                "--trace-block-size",
            ),
            (
                "{\"hash_ids\": [1], \"output_length\": 1, \"session_id\": 4}",
                "session_id: expected a JSON string",
            ),
            (
                "{\"hash_ids\": [1], \"output_length\": 1, \"session_id\": \"a\", \"delay\": 3}",
                "first turn",
            ),
            ("[1]", "line 1: json"),
            (
                "{\"timestamp\": 0, \"output_length\": 10, \"hash_ids\": []}",
                "line 1: hash_ids: a request needs at least one prompt token",
            ),
            (
                "{\"input_length\": 0, \"output_length\": 10, \"hash_ids\": [1]}",
                "line 1: input_length: a request needs at least one prompt token",
            ),
        ];
        for (text, expected) in cases {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }

    #[test]
    fn block_hashes_follow_content_across_block_sizes() {
        let p = |ids: Vec<u32>, len| Prompt {
            ids,
            block_tokens: 512,
            len,
        };
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
        };
        let w = spec.build();
        assert_eq!(w.request_count(), 60);
        let first = &w.sessions[0].turns[0].prompt.ids;
        assert_eq!(first.len(), 10);
        assert!(first[..5].iter().all(|&id| id < 10), "group prefix ids");
        assert!(w.sessions[1].start_ms > 0.0);
        assert_eq!(w, spec.build(), "same seed, same workload");
    }
}
