//! Weka/AgentX agent traces (`--trace-format weka`), as AISimulate 0.13 reads them: each trace
//! object is one recorded agent session ("play") — `id`, `block_size`, `hash_id_scope`
//! (`"local"`), `models`, and `requests`, each a model call (`type` `n` or `s`: `t` in seconds,
//! `model`, `in`, `out`, `hash_ids`, `api_time`) or a sub-agent marker (`type` `subagent`:
//! `t`, `agent_id`, `status` `completed` (the parent waits for it) or `async_launched`,
//! `duration_ms`, and its own `requests`). A source is a `.json` file (one object), a `.jsonl`
//! file (objects one after another) or a directory of them, read in path order.
//!
//! The calls carry no explicit dependencies; they are inferred as AISimulate infers them, and
//! the play becomes an agentic request graph (the version 2 `agentic_mooncake` rows of
//! [`crate::agentic`]):
//!
//! - **chains**: calls in time order; a call whose prompt extends a chain's last prompt (same
//!   model, that call already ended) continues the chain, otherwise it forks a new chain from
//!   the one it shares the longest prefix with. A fork that starts after its parent's tail
//!   ended and shares enough of it (or follows within an hour) is a *seam*: the same
//!   conversation resumed, spliced back into its parent. The earliest chain is the main
//!   stream, the others workers; a first call that shares nothing with the rest is a
//!   preamble of the main stream;
//! - **edges**: each call follows the previous one of its stream on completion (delay: the
//!   recorded gap); a worker or sub-agent stream is spawned by the call it forked from (on
//!   dispatch when it started while that call ran, else on completion); a call waits for the
//!   latest call of every other stream of its scope that had ended before it began (replay
//!   barriers); a completed sub-agent's last calls are joined by the parent's first call
//!   after the sub-agent ended; a stream with no edge is spawned by the play's first call;
//! - **hash ids** name content within their source object: a full block is its recorded
//!   hash there (or private when the prompt outruns its hash ids), a partial last block is
//!   private to its call;
//! - **nested timestamps** (sub-agent calls) are absolute, or relative to their marker: a
//!   corpus with any inner call earlier than its marker is read as relative (the automatic
//!   rule), unless a basis is given.
//!
//! Every play starts at its first call. Bad input is a one-line error naming the file, the
//! line of the trace object, and the field.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value as Json};

use crate::agentic::{Rows, SCHEMA, VERSION};
use crate::args::EngineVersion;
use crate::error::{Error, Result};
use crate::limits::{read_bytes, MAX_DATASET_BYTES, MAX_HASH_IDS_PER_ROW};
use crate::workload::Workload;

/// Calls this close in time (seconds) count as simultaneous when ordering ends and starts.
const EPSILON_S: f64 = 1e-6;
/// A fork resumed more than this long (seconds) after its parent ended is a seam only when it
/// shares at least [`SEAM_MIN_OVERLAP`] of the parent's prompt.
const SEAM_MAX_GAP_S: f64 = 3600.0;
const SEAM_MIN_OVERLAP: f64 = 0.5;
/// A first call that generated more than this shares no block with the rest to be a preamble.
const PREAMBLE_MAX_OUTPUT: u64 = 64;
/// The most blocks one prompt may span: a bound on what a call's `in` makes us allocate.
const MAX_BLOCKS: u64 = MAX_HASH_IDS_PER_ROW as u64;

/// How sub-agent calls' timestamps relate to their marker's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NestedTimestamps {
    /// Relative when any inner call of the corpus comes before its marker, else absolute.
    #[default]
    Auto,
    Absolute,
    Relative,
}

#[derive(Clone, Debug, Deserialize)]
struct Trace {
    id: String,
    #[serde(default)]
    models: Vec<String>,
    block_size: u64,
    hash_id_scope: String,
    requests: Vec<Entry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type")]
enum Entry {
    #[serde(rename = "n", alias = "s")]
    Call(Call),
    #[serde(rename = "subagent")]
    Subagent(Subagent),
}

#[derive(Clone, Debug, Deserialize)]
struct Call {
    t: f64,
    model: String,
    #[serde(rename = "in")]
    input: u64,
    #[serde(rename = "out")]
    output: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    api_time: Option<f64>,
}

#[derive(Clone, Debug, Deserialize)]
struct Subagent {
    t: f64,
    agent_id: String,
    /// Required, as AISimulate requires it; what kind of agent it was changes nothing here.
    #[serde(rename = "subagent_type")]
    _kind: String,
    #[serde(default)]
    duration_ms: Option<i64>,
    status: String,
    requests: Vec<InnerEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type")]
enum InnerEntry {
    #[serde(rename = "n", alias = "s")]
    Call(Call),
}

impl InnerEntry {
    fn call(&self) -> &Call {
        let InnerEntry::Call(c) = self;
        c
    }
}

/// One trace object and where it came from.
struct Play {
    /// The source's name in ids and hash identities: its path below the corpus root, with
    /// `#NNNNNN` for an object of a `.jsonl` file.
    name: String,
    file: String,
    line: u64,
    trace: Trace,
}

impl Play {
    fn error(&self, field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::line(self.line, field, message).in_file(&self.file)
    }
}

/// Reads a Weka corpus (a `.json` or `.jsonl` file, or a directory of them) as an agentic
/// request graph, its times and delays divided by `speedup` (see
/// [`Workload::speed_up_arrivals`]), which the graph's digest covers. `block_size`, when
/// given, must equal the corpus's own.
pub fn read_weka(
    path: &Path,
    block_size: Option<u32>,
    basis: NestedTimestamps,
    speedup: f64,
) -> Result<Workload> {
    let shown = path.display().to_string();
    let mut plays = Vec::new();
    // The corpus's digest, as AISimulate takes it: each file's name and length, then its
    // bytes, after a domain tag.
    let mut corpus = blake3::Hasher::new();
    corpus.update(b"aisimulate-weka-corpus-v1\0");
    for (file, name) in source_files(path)? {
        read_file(&file, &name, &mut plays, &mut corpus)?;
    }
    if plays.is_empty() {
        return Err(Error::bad_input("the Weka source holds no trace object").in_file(&shown));
    }
    let mut block = None;
    let (mut relative_evidence, mut nested) = (false, false);
    for play in &plays {
        validate(play)?;
        relative_evidence |= inner_before_marker(&play.trace);
        nested |= play.trace.requests.iter().any(|entry| match entry {
            Entry::Subagent(s) => !s.requests.is_empty(),
            Entry::Call(_) => false,
        });
        match block {
            Some(b) if b != play.trace.block_size => {
                return Err(play.error(
                    "block_size",
                    format!(
                        "{}, but the corpus's earlier traces have {b}",
                        play.trace.block_size
                    ),
                ))
            }
            _ => block = Some(play.trace.block_size),
        }
    }
    let block = block.expect("a play");
    if let Some(given) = block_size.filter(|&b| u64::from(b) != block) {
        return Err(plays[0].error(
            "block_size",
            format!("{block}, but the trace block size given is {given}"),
        ));
    }
    let relative = match basis {
        NestedTimestamps::Absolute => false,
        NestedTimestamps::Relative => true,
        NestedTimestamps::Auto => relative_evidence,
    };
    // The graph's provenance: the corpus's digest with the basis its nested times were read
    // in, as AISimulate names it.
    let basis_name = match basis {
        NestedTimestamps::Auto if !nested => "not_applicable",
        _ if relative => "relative",
        _ => "absolute",
    };
    let raw = corpus.finalize().to_hex().to_string();
    let mut semantic = blake3::Hasher::new();
    semantic.update(b"aisimulate-weka-corpus-semantics-v2\0");
    for part in [raw.as_str(), basis_name] {
        framed(&mut semantic, part.as_bytes());
    }
    let digest = semantic.finalize().to_hex().to_string();
    // The rows are version 2, which every engine version reads alike; each is numbered as
    // the line it would take in an agentic_mooncake file, the header first. A play's rows
    // are read as it is lowered, so no more than one play's are held at a time.
    let graph = |e: Error| {
        Error::bad_input(format!("the graph its calls imply is not valid: {e}")).in_file(&shown)
    };
    // The graph's identity is wanted; its source is the header's.
    let mut rows = Rows::new(None, Some(String::new()));
    let header = json!({
        "schema": SCHEMA,
        "version": VERSION,
        "block_size": block,
        "hash_id_scope": "local",
        "source": {"format": "weka", "digest": digest},
    });
    rows.add(1, header).map_err(graph)?;
    let (mut hashes, mut line) = (HashMap::new(), 1);
    for (ordinal, play) in plays.iter().enumerate() {
        for row in lower(play, ordinal, relative, &mut hashes)? {
            line += 1;
            rows.add(line, row).map_err(graph)?;
        }
    }
    rows.finish(EngineVersion::Aisimulate013, speedup)
        .map_err(graph)
}

/// The source's files with their names below the corpus root, in path order; symbolic
/// links refused, other files in a directory skipped.
fn source_files(path: &Path) -> Result<Vec<(PathBuf, String)>> {
    let shown = path.display().to_string();
    let meta =
        fs::symlink_metadata(path).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
    if meta.file_type().is_symlink() {
        return Err(Error::bad_input("a Weka source may not be a symbolic link").in_file(&shown));
    }
    if meta.is_file() {
        if !is_weka(path) {
            return Err(
                Error::bad_input("a Weka source file ends in .json or .jsonl").in_file(&shown),
            );
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::bad_input("the file name is not UTF-8").in_file(&shown))?;
        return Ok(vec![(path.to_path_buf(), name.to_owned())]);
    }
    let mut files = Vec::new();
    visit(path, path, &mut files)?;
    files.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(files)
}

fn visit(root: &Path, dir: &Path, files: &mut Vec<(PathBuf, String)>) -> Result<()> {
    let shown = dir.display().to_string();
    let mut entries = fs::read_dir(dir)
        .and_then(|d| d.collect::<std::io::Result<Vec<_>>>())
        .map_err(|e| Error::io("cannot read the directory", e).in_file(&shown))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)
            .map_err(|e| Error::io("cannot open", e).in_file(path.display()))?;
        if meta.file_type().is_symlink() {
            return Err(
                Error::bad_input("a Weka corpus may not hold symbolic links")
                    .in_file(path.display()),
            );
        }
        if meta.is_dir() {
            visit(root, &path, files)?;
        } else if meta.is_file() && is_weka(&path) {
            let relative = path
                .strip_prefix(root)
                .expect("below the root")
                .components()
                .map(|c| c.as_os_str().to_str())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::bad_input("the path is not UTF-8").in_file(path.display()))?
                .join("/");
            files.push((path, relative));
        }
    }
    Ok(())
}

fn is_weka(path: &Path) -> bool {
    path.extension()
        .and_then(|x| x.to_str())
        .is_some_and(|x| x.eq_ignore_ascii_case("json") || x.eq_ignore_ascii_case("jsonl"))
}

/// Feeds `bytes` to a digest after their length (8 bytes, little-endian), as AISimulate
/// frames each part of its corpus digests.
fn framed(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// Parses a file's trace objects: one in a `.json` file, any number in a `.jsonl` one.
fn read_file(
    path: &Path,
    name: &str,
    plays: &mut Vec<Play>,
    corpus: &mut blake3::Hasher,
) -> Result<()> {
    let shown = path.display().to_string();
    let bytes = read_bytes(path, MAX_DATASET_BYTES)
        .map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    framed(corpus, name.as_bytes());
    framed(corpus, &bytes);
    let jsonl = path
        .extension()
        .and_then(|x| x.to_str())
        .is_some_and(|x| x.eq_ignore_ascii_case("jsonl"));
    // The objects' lines, counted on from the one before: counting each from the start of
    // the file took time in the square of the objects (30,000 took 200 s).
    let (mut counted, mut line) = (0, 1u64);
    let mut stream = serde_json::Deserializer::from_slice(&bytes).into_iter::<Json>();
    let mut index = 0usize;
    loop {
        let start = stream.byte_offset();
        let start = start
            + bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
        let Some(value) = stream.next() else { break };
        line += bytes[counted..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        counted = start;
        let value = value.map_err(|e| {
            Error::line(
                e.line() as u64,
                "json",
                format!("not a JSON trace object: {e}"),
            )
            .in_file(&shown)
        })?;
        if !jsonl && index > 0 {
            return Err(Error::line(
                line,
                "json",
                "a .json Weka source holds one trace object; name the file .jsonl for several",
            )
            .in_file(&shown));
        }
        let trace = Trace::deserialize(&value)
            .map_err(|e| Error::line(line, field_of(&e), e.to_string()).in_file(&shown))?;
        plays.push(Play {
            name: if jsonl {
                format!("{name}#{index:06}")
            } else {
                name.to_owned()
            },
            file: shown.clone(),
            line,
            trace,
        });
        index += 1;
    }
    if index == 0 {
        return Err(Error::bad_input("the file holds no trace object").in_file(&shown));
    }
    Ok(())
}

/// The field serde's message names (`missing field `t``), `type` for an unknown kind of
/// entry, or the trace's requests.
fn field_of(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.starts_with("unknown variant") || text.contains("field `type`") {
        return "type".into();
    }
    match text.strip_prefix("missing field `") {
        Some(rest) => rest.split('`').next().unwrap_or("requests").to_owned(),
        None => "requests".into(),
    }
}

/// Whether a sub-agent call of this trace comes before its marker: the automatic rule's
/// evidence that nested times are relative.
fn inner_before_marker(trace: &Trace) -> bool {
    trace.requests.iter().any(|entry| match entry {
        Entry::Subagent(s) => s.requests.iter().any(|r| r.call().t < s.t - EPSILON_S),
        Entry::Call(_) => false,
    })
}

fn validate(play: &Play) -> Result<()> {
    let trace = &play.trace;
    if trace.id.trim().is_empty() {
        return Err(play.error("id", "empty"));
    }
    if trace.block_size == 0 || trace.block_size > u64::from(u32::MAX) {
        return Err(play.error("block_size", "expected a positive token count"));
    }
    if trace.hash_id_scope != "local" {
        return Err(play.error(
            "hash_id_scope",
            format!(
                "\"{}\": expected \"local\"",
                trace.hash_id_scope.escape_debug()
            ),
        ));
    }
    if trace.models.iter().any(|m| m.trim().is_empty()) {
        return Err(play.error("models", "an empty model name"));
    }
    let declared: BTreeSet<&str> = trace.models.iter().map(String::as_str).collect();
    let mut calls = 0;
    for (i, entry) in trace.requests.iter().enumerate() {
        match entry {
            Entry::Call(c) => {
                validate_call(play, c, &format!("requests[{i}]"), &declared)?;
                calls += 1;
            }
            Entry::Subagent(s) => {
                let at = format!("requests[{i}]");
                if !(s.t.is_finite() && s.t >= 0.0) {
                    return Err(
                        play.error(format!("{at}.t"), "expected a finite, non-negative time")
                    );
                }
                if s.agent_id.trim().is_empty() {
                    return Err(play.error(format!("{at}.agent_id"), "empty"));
                }
                if s.duration_ms.is_some_and(|d| d < 0) {
                    return Err(play.error(format!("{at}.duration_ms"), "negative"));
                }
                match s.status.as_str() {
                    "completed" if s.requests.is_empty() => {
                        return Err(play.error(
                            format!("{at}.requests"),
                            "a completed sub-agent with no calls: the parent's wait on it cannot be replayed",
                        ))
                    }
                    "completed" | "async_launched" => {}
                    other => {
                        return Err(play.error(
                            format!("{at}.status"),
                            format!(
                                "\"{}\": expected completed or async_launched",
                                other.escape_debug()
                            ),
                        ))
                    }
                }
                for (j, inner) in s.requests.iter().enumerate() {
                    validate_call(
                        play,
                        inner.call(),
                        &format!("{at}.requests[{j}]"),
                        &declared,
                    )?;
                    calls += 1;
                }
            }
        }
    }
    if calls == 0 {
        return Err(play.error("requests", "the trace holds no model call"));
    }
    Ok(())
}

fn validate_call(play: &Play, c: &Call, at: &str, declared: &BTreeSet<&str>) -> Result<()> {
    if !(c.t.is_finite() && c.t >= 0.0) {
        return Err(play.error(format!("{at}.t"), "expected a finite, non-negative time"));
    }
    if c.model.trim().is_empty() {
        return Err(play.error(format!("{at}.model"), "empty"));
    }
    if !declared.is_empty() && !declared.contains(c.model.as_str()) {
        return Err(play.error(
            format!("{at}.model"),
            format!(
                "\"{}\" is not among the trace's models",
                c.model.escape_debug()
            ),
        ));
    }
    if c.input == 0 {
        return Err(play.error(format!("{at}.in"), "a call with no input tokens"));
    }
    if c.input.div_ceil(play.trace.block_size.max(1)) > MAX_BLOCKS {
        return Err(play.error(
            format!("{at}.in"),
            format!("{} tokens: more than {MAX_BLOCKS} blocks", c.input),
        ));
    }
    if c.api_time.is_some_and(|a| !(a.is_finite() && a >= 0.0)) {
        return Err(play.error(
            format!("{at}.api_time"),
            "expected a finite, non-negative duration",
        ));
    }
    Ok(())
}

/// A call with its place in the source.
#[derive(Clone)]
struct Indexed {
    source_id: String,
    order: usize,
    call: Call,
}

/// When a call ended: its start plus its recorded duration (none: it took no time).
fn end(c: &Call) -> f64 {
    c.t + c.api_time.unwrap_or(0.0).max(0.0)
}

/// Seconds to milliseconds, rounded to the nanosecond.
fn ms(seconds: f64) -> f64 {
    (seconds.max(0.0) * 1e9).round() / 1e6
}

fn by_time(a: &Indexed, b: &Indexed) -> std::cmp::Ordering {
    a.call
        .t
        .total_cmp(&b.call.t)
        .then(a.order.cmp(&b.order))
        .then(a.source_id.cmp(&b.source_id))
}

fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

struct Fork {
    source_id: Option<String>,
    depth: usize,
    time: f64,
}

#[derive(Default)]
struct Chain {
    calls: Vec<Indexed>,
    fork: Option<Fork>,
    spliced_into: Option<usize>,
    /// The last call that had hash ids.
    tail: Option<String>,
    tail_hashes: Vec<u64>,
    tail_end: f64,
    tail_model: String,
}

impl Chain {
    fn push(&mut self, index: usize, owner: &mut HashMap<String, usize>, call: Indexed) {
        owner.insert(call.source_id.clone(), index);
        if !call.call.hash_ids.is_empty() {
            self.tail = Some(call.source_id.clone());
            self.tail_hashes.clone_from(&call.call.hash_ids);
            self.tail_end = end(&call.call);
            self.tail_model.clone_from(&call.call.model);
        }
        self.calls.push(call);
    }
}

/// The chains of one set of calls: the main one, then the workers in time order.
struct Chains {
    chains: Vec<Chain>,
    main: usize,
    workers: Vec<usize>,
}

/// Takes out a first call that shares nothing with the others (a preamble of the main
/// stream).
fn split_preamble(mut calls: Vec<Indexed>) -> (Vec<Indexed>, Vec<Indexed>) {
    calls.sort_by(by_time);
    if calls.len() < 2 || calls[0].call.hash_ids.is_empty() {
        return (Vec::new(), calls);
    }
    let first = &calls[0].call;
    if calls[1..]
        .iter()
        .any(|o| common_prefix(&first.hash_ids, &o.call.hash_ids) > 0)
    {
        return (Vec::new(), calls);
    }
    if first.output > PREAMBLE_MAX_OUTPUT {
        let others: HashSet<u64> = calls[1..]
            .iter()
            .flat_map(|o| o.call.hash_ids.iter().copied())
            .collect();
        if first.hash_ids.iter().any(|h| others.contains(h)) {
            return (Vec::new(), calls);
        }
    }
    let first = calls.remove(0);
    (vec![first], calls)
}

fn detect_chains(mut calls: Vec<Indexed>) -> Chains {
    calls.sort_by(by_time);
    let mut chains: Vec<Chain> = Vec::new();
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut forks: HashMap<String, Vec<usize>> = HashMap::new();
    let mut by_source: HashMap<String, Call> = HashMap::new();
    for c in calls {
        by_source.insert(c.source_id.clone(), c.call.clone());
        if chains.is_empty() {
            chains.push(Chain::default());
        }
        if c.call.hash_ids.is_empty() {
            owner.insert(c.source_id.clone(), 0);
            chains[0].calls.push(c);
            continue;
        }
        if chains.len() == 1 && chains[0].calls.is_empty() {
            chains[0].push(0, &mut owner, c);
            continue;
        }
        if let Some(target) = extension_target(&chains, &c.call) {
            chains[target].push(target, &mut owner, c);
            continue;
        }
        if chains.iter().all(|ch| ch.tail_hashes.is_empty()) {
            chains[0].push(0, &mut owner, c);
            continue;
        }
        let (parent, depth) = longest_prefix_chain(&chains, &c.call.hash_ids);
        let source_id = parent.and_then(|p| chains[p].tail.clone());
        let index = chains.len();
        chains.push(Chain {
            fork: Some(Fork {
                source_id: source_id.clone(),
                depth,
                time: c.call.t,
            }),
            ..Chain::default()
        });
        chains[index].push(index, &mut owner, c);
        if let Some(s) = source_id.filter(|_| depth > 0) {
            forks.entry(s).or_default().push(index);
        }
    }
    resolve_seams(&mut chains, &mut forks, &mut owner, &by_source);
    let live = |i: &usize| chains[*i].spliced_into.is_none();
    let main = (0..chains.len())
        .filter(live)
        .min_by(|a, b| by_time(&chains[*a].calls[0], &chains[*b].calls[0]))
        .unwrap_or(0);
    let mut workers: Vec<usize> = (0..chains.len())
        .filter(|i| live(i) && *i != main)
        .collect();
    workers.sort_by(|a, b| by_time(&chains[*a].calls[0], &chains[*b].calls[0]));
    Chains {
        chains,
        main,
        workers,
    }
}

/// The chain whose last prompt this call's extends (the longest such, the first on a tie):
/// the same model, and that call over by the time this one starts.
fn extension_target(chains: &[Chain], c: &Call) -> Option<usize> {
    let mut best = None;
    let mut best_len = 0;
    for (i, ch) in chains.iter().enumerate() {
        let n = ch.tail_hashes.len();
        if n == 0
            || n > c.hash_ids.len()
            || n <= best_len
            || ch.tail_model != c.model
            || ch.tail_end > c.t + EPSILON_S
            || ch.tail_hashes[..] != c.hash_ids[..n]
        {
            continue;
        }
        best = Some(i);
        best_len = n;
    }
    best
}

/// The chain whose last prompt shares the longest prefix with `hashes` (the longer tail on a
/// tie, then the first), and that prefix's length.
fn longest_prefix_chain(chains: &[Chain], hashes: &[u64]) -> (Option<usize>, usize) {
    let mut best = None;
    let mut best_key = (0, 0);
    for (i, ch) in chains.iter().enumerate() {
        let depth = common_prefix(&ch.tail_hashes, hashes);
        let key = (depth, ch.tail_hashes.len());
        if depth > 0 && key > best_key {
            best = Some(i);
            best_key = key;
        }
    }
    (best, best_key.0)
}

/// Splices each parent's best resumed fork back into it, in order of the parents' source
/// ids; the parent's other forks then fork from the spliced chain's tail where they still
/// can.
fn resolve_seams(
    chains: &mut [Chain],
    forks: &mut HashMap<String, Vec<usize>>,
    owner: &mut HashMap<String, usize>,
    by_source: &HashMap<String, Call>,
) {
    let mut pending: BTreeSet<String> = forks.keys().cloned().collect();
    let mut aliases: HashMap<usize, usize> = HashMap::new();
    let mut done: HashSet<String> = HashSet::new();
    while let Some(source) = pending.pop_first() {
        if !done.insert(source.clone()) {
            continue;
        }
        let mut parent = owner[&source];
        while let Some(&next) = aliases.get(&parent) {
            parent = next;
        }
        if chains[parent].tail.as_deref() != Some(source.as_str()) {
            continue;
        }
        let tail = &by_source[&source];
        let registered: Vec<usize> = forks[&source]
            .iter()
            .copied()
            .filter(|&i| chains[i].spliced_into.is_none())
            .collect();
        // The deepest fork, then the earliest, then the first chain.
        let elected = registered
            .iter()
            .copied()
            .filter(|&i| is_seam(&chains[i], tail))
            .max_by(|&a, &b| {
                let (fa, fb) = (
                    chains[a].fork.as_ref().expect("a fork"),
                    chains[b].fork.as_ref().expect("a fork"),
                );
                fa.depth
                    .cmp(&fb.depth)
                    .then_with(|| fb.time.total_cmp(&fa.time))
                    .then_with(|| b.cmp(&a))
            });
        let Some(elected) = elected else { continue };
        let moved = std::mem::take(&mut chains[elected].calls);
        for c in &moved {
            owner.insert(c.source_id.clone(), parent);
        }
        chains[parent].calls.extend(moved);
        chains[parent].tail = chains[elected].tail.clone();
        chains[parent].tail_hashes = chains[elected].tail_hashes.clone();
        chains[parent].tail_end = chains[elected].tail_end;
        chains[parent].tail_model = chains[elected].tail_model.clone();
        chains[elected].spliced_into = Some(parent);
        aliases.insert(elected, parent);
        let Some(new_tail) = chains[parent].tail.clone() else {
            continue;
        };
        let new_hashes = chains[parent].tail_hashes.clone();
        let new_t = by_source[&new_tail].t;
        for candidate in registered {
            if candidate == elected || chains[candidate].spliced_into.is_some() {
                continue;
            }
            let first = &chains[candidate].calls[0].call;
            if new_t > first.t + EPSILON_S {
                continue;
            }
            let depth = common_prefix(&new_hashes, &first.hash_ids);
            if depth == 0 {
                continue;
            }
            let fork = chains[candidate].fork.as_mut().expect("a fork");
            fork.source_id = Some(new_tail.clone());
            fork.depth = depth;
            forks.entry(new_tail.clone()).or_default().push(candidate);
            done.remove(&new_tail);
            pending.insert(new_tail.clone());
        }
    }
}

/// Whether a fork resumes its parent's conversation: it starts after the parent's tail
/// ended, on the same model, and not long after unless it shares most of the prompt.
fn is_seam(chain: &Chain, tail: &Call) -> bool {
    let Some(fork) = chain.fork.as_ref() else {
        return false;
    };
    if fork.depth == 0 || chain.calls.is_empty() {
        return false;
    }
    let first = &chain.calls[0].call;
    let gap = first.t - end(tail);
    let overlap = fork.depth as f64 / tail.hash_ids.len().max(1) as f64;
    end(tail) <= first.t + EPSILON_S
        && first.model == tail.model
        && !(gap > SEAM_MAX_GAP_S && overlap < SEAM_MIN_OVERLAP)
}

/// A replay stream: a session of calls, the call that spawned it, and the scope whose
/// streams wait for each other.
struct Stream {
    session_id: String,
    calls: Vec<Indexed>,
    spawned_by: Option<String>,
    scope: String,
}

fn streams_of(
    namespace: &str,
    prefix: &str,
    mut found: Chains,
    preamble: Vec<Indexed>,
) -> Vec<Stream> {
    let mut take = |i: usize| {
        let chain = &mut found.chains[i];
        let spawned_by = chain.fork.as_ref().and_then(|f| f.source_id.clone());
        (std::mem::take(&mut chain.calls), spawned_by)
    };
    let (mut main, spawned_by) = take(found.main);
    main.extend(preamble);
    main.sort_by(by_time);
    let scope = format!("{namespace}:scope:{prefix}");
    let mut streams = vec![Stream {
        session_id: format!("{namespace}:session:{prefix}"),
        calls: main,
        spawned_by,
        scope: scope.clone(),
    }];
    for (k, &i) in found.workers.iter().enumerate() {
        let (calls, spawned_by) = take(i);
        streams.push(Stream {
            session_id: format!("{namespace}:session:{prefix}:worker:{k}"),
            calls,
            spawned_by,
            scope: scope.clone(),
        });
    }
    streams
}

/// One dependency of a lowered row.
#[derive(Clone, PartialEq)]
struct Edge {
    on: String,
    dispatch: bool,
    delay_ms: f64,
    relation: &'static str,
}

fn add(edges: &mut Vec<Edge>, edge: Edge) {
    if !edges
        .iter()
        .any(|e| e.on == edge.on && e.dispatch == edge.dispatch && e.relation == edge.relation)
    {
        edges.push(edge);
    }
}

/// The play's calls as version 2 `agentic_mooncake` rows, sorted by request id.
fn lower(
    play: &Play,
    ordinal: usize,
    relative: bool,
    hashes: &mut HashMap<u64, String>,
) -> Result<Vec<Json>> {
    let trace = &play.trace;
    let namespace = format!(
        "weka:{}",
        &blake3::hash(play.name.as_bytes()).to_hex()[..16]
    );
    let play_id = format!("{namespace}:play:{}", trace.id);
    let mut top = Vec::new();
    let mut subagents = Vec::new();
    for (i, entry) in trace.requests.iter().enumerate() {
        match entry {
            Entry::Call(c) => top.push(Indexed {
                source_id: format!("outer:{i}"),
                order: i,
                call: c.clone(),
            }),
            Entry::Subagent(s) => subagents.push((i, s)),
        }
    }
    if top.is_empty() {
        return Err(play.error(
            "requests",
            "the trace holds no call of its own, only sub-agents",
        ));
    }
    let (preamble, rest) = split_preamble(top);
    let mut streams = streams_of(&namespace, "root", detect_chains(rest), preamble);
    let parents = streams.len();
    let mut joins: Vec<(String, Vec<String>)> = Vec::new();
    for (i, s) in subagents {
        let at = format!("requests[{i}]");
        let spawner = streams[..parents]
            .iter()
            .enumerate()
            .flat_map(|(k, st)| st.calls.iter().map(move |c| (k, c)))
            .filter(|(_, c)| c.order < i)
            .max_by_key(|(_, c)| c.order);
        let Some((owner, spawner)) = spawner else {
            return Err(play.error(at, "a sub-agent before any call of its parent"));
        };
        let spawner = spawner.source_id.clone();
        let mut inner = Vec::with_capacity(s.requests.len());
        for (j, entry) in s.requests.iter().enumerate() {
            let mut call = entry.call().clone();
            call.t = nested_time(play, &at, j, call.t, s.t, relative)?;
            inner.push(Indexed {
                source_id: format!("outer:{i}:inner:{j}"),
                order: j,
                call,
            });
        }
        if inner.is_empty() {
            continue;
        }
        let prefix = format!("subagent:{i}:{}", s.agent_id);
        let (preamble, rest) = split_preamble(inner);
        let mut children = streams_of(&namespace, &prefix, detect_chains(rest), preamble);
        children[0].spawned_by = Some(spawner);
        let scope = children[0].session_id.clone();
        for c in &mut children {
            c.scope.clone_from(&scope);
        }
        let join = if s.status == "completed" {
            let ended = subagent_end(play, &at, s, relative)?;
            streams[owner]
                .calls
                .iter()
                .filter(|c| c.order > i && c.call.t + EPSILON_S >= ended)
                .min_by_key(|c| c.order)
                .map(|c| c.source_id.clone())
        } else {
            None
        };
        let first_child = streams.len();
        streams.extend(children);
        if let Some(join) = join {
            let terminals: Vec<String> = streams[first_child..]
                .iter()
                .filter_map(|st| st.calls.last().map(|c| c.source_id.clone()))
                .collect();
            if !terminals.is_empty() {
                joins.push((join, terminals));
            }
        }
    }

    let root_time = streams
        .iter()
        .flat_map(|st| st.calls.iter())
        .map(|c| c.call.t)
        .fold(f64::INFINITY, f64::min);
    let row_id = |source: &str| format!("{namespace}:request:{source}");
    let call_of: HashMap<&str, &Call> = streams
        .iter()
        .flat_map(|st| st.calls.iter())
        .map(|c| (c.source_id.as_str(), &c.call))
        .collect();
    let root_source = streams[0].calls[0].source_id.clone();
    let mut edges: HashMap<String, Vec<Edge>> = HashMap::new();
    for st in &streams {
        for pair in st.calls.windows(2) {
            add(
                edges.entry(pair[1].source_id.clone()).or_default(),
                Edge {
                    on: row_id(&pair[0].source_id),
                    dispatch: false,
                    delay_ms: ms(pair[1].call.t - end(&pair[0].call)),
                    relation: "sequence",
                },
            );
        }
    }
    for st in &streams {
        let (Some(first), Some(spawner)) = (st.calls.first(), st.spawned_by.as_deref()) else {
            continue;
        };
        let parent = call_of[spawner];
        let (dispatch, delay) = if first.call.t < end(parent) {
            (true, ms(first.call.t - parent.t))
        } else {
            (false, ms(first.call.t - end(parent)))
        };
        add(
            edges.entry(first.source_id.clone()).or_default(),
            Edge {
                on: row_id(spawner),
                dispatch,
                delay_ms: delay,
                relation: "spawn",
            },
        );
    }
    replay_barriers(&streams, &row_id, &mut edges);
    for (target, terminals) in joins {
        let t = call_of[target.as_str()].t;
        for terminal in terminals {
            add(
                edges.entry(target.clone()).or_default(),
                Edge {
                    on: row_id(&terminal),
                    dispatch: false,
                    delay_ms: ms(t - end(call_of[terminal.as_str()])),
                    relation: "join",
                },
            );
        }
    }
    // A stream nothing leads to is spawned by the play's first call.
    let root_t = streams[0].calls[0].call.t;
    for st in &streams {
        let Some(first) = st.calls.first() else {
            continue;
        };
        if first.source_id == root_source
            || edges.get(&first.source_id).is_some_and(|e| !e.is_empty())
        {
            continue;
        }
        add(
            edges.entry(first.source_id.clone()).or_default(),
            Edge {
                on: row_id(&root_source),
                dispatch: true,
                delay_ms: ms(first.call.t - root_t),
                relation: "spawn",
            },
        );
    }

    let block = trace.block_size;
    let mut rows = Vec::new();
    for st in &streams {
        for c in &st.calls {
            let id = row_id(&c.source_id);
            let deps: Vec<Json> = edges
                .remove(&c.source_id)
                .unwrap_or_default()
                .into_iter()
                .map(|e| {
                    json!({"request_id": e.on,
                           "trigger": if e.dispatch { "dispatch" } else { "completion" },
                           "delay_ms": e.delay_ms, "relation": e.relation})
                })
                .collect();
            rows.push((
                id.clone(),
                json!({
                    "request_id": id,
                    "play_id": play_id,
                    "source_play_ordinal": ordinal,
                    "session_id": st.session_id,
                    "model": c.call.model,
                    "input_length": c.call.input,
                    "output_length": c.call.output,
                    "hash_ids": block_hashes(&play.name, &id, &c.call, block, hashes),
                    "not_before_ms": ms(c.call.t - root_time),
                    "recorded_api_time_ms": c.call.api_time.map(ms),
                    "dependencies": deps,
                }),
            ));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(rows.into_iter().map(|(_, row)| row).collect())
}

/// Every call waits for the latest call of each other stream of its scope that ended before
/// it began, leaving out those another such call followed.
fn replay_barriers(
    streams: &[Stream],
    row_id: &dyn Fn(&str) -> String,
    edges: &mut HashMap<String, Vec<Edge>>,
) {
    let mut scopes: BTreeMap<&str, Vec<&Stream>> = BTreeMap::new();
    for st in streams {
        scopes.entry(st.scope.as_str()).or_default().push(st);
    }
    let before = |a: &Call, b: &Call| a.t < b.t && end(a) <= b.t + EPSILON_S;
    for members in scopes.values() {
        for target in members {
            for c in &target.calls {
                let frontier: Vec<&Indexed> = members
                    .iter()
                    .filter(|other| !std::ptr::eq(**other, *target))
                    .filter_map(|other| {
                        other
                            .calls
                            .iter()
                            .filter(|p| before(&p.call, &c.call))
                            .max_by(|a, b| {
                                end(&a.call)
                                    .total_cmp(&end(&b.call))
                                    .then(a.call.t.total_cmp(&b.call.t))
                                    .then(a.source_id.cmp(&b.source_id))
                            })
                    })
                    .collect();
                for p in frontier
                    .iter()
                    .filter(|p| !frontier.iter().any(|later| before(&p.call, &later.call)))
                {
                    add(
                        edges.entry(c.source_id.clone()).or_default(),
                        Edge {
                            on: row_id(&p.source_id),
                            dispatch: false,
                            delay_ms: 0.0,
                            relation: "replay_barrier",
                        },
                    );
                }
            }
        }
    }
}

/// A sub-agent call's time on the play's clock.
fn nested_time(
    play: &Play,
    at: &str,
    j: usize,
    t: f64,
    marker: f64,
    relative: bool,
) -> Result<f64> {
    if relative {
        let t = marker + t;
        if !t.is_finite() {
            return Err(play.error(format!("{at}.requests[{j}].t"), "overflows"));
        }
        return Ok(t);
    }
    if t < marker - EPSILON_S {
        return Err(play.error(
            format!("{at}.requests[{j}].t"),
            format!(
                "{t} is before its sub-agent's marker at {marker}, and nested times are absolute"
            ),
        ));
    }
    Ok(t.max(marker))
}

/// When a sub-agent ended: its marker plus its duration, or its last call's end.
fn subagent_end(play: &Play, at: &str, s: &Subagent, relative: bool) -> Result<f64> {
    if let Some(d) = s.duration_ms {
        return Ok(s.t + d as f64 / 1000.0);
    }
    let mut ended = s.t;
    for (j, r) in s.requests.iter().enumerate() {
        let c = r.call();
        ended = ended.max(
            nested_time(play, at, j, c.t, s.t, relative)? + c.api_time.unwrap_or(0.0).max(0.0),
        );
    }
    Ok(ended)
}

/// One hash id per block of the prompt: a full block is its recorded hash within this source
/// (private to the call when the prompt outruns its hash ids); a partial last block is
/// private to the call. An id is the first 8 bytes of the BLAKE3 hash of its kind, its
/// identity and a nonce, the nonce counting up past a value another identity holds: the
/// ids AISimulate gives, which its graph's digest covers.
fn block_hashes(
    source: &str,
    request_id: &str,
    c: &Call,
    block: u64,
    hashes: &mut HashMap<u64, String>,
) -> Vec<u64> {
    let full = c.input / block;
    let mut id = |partial: bool, identity: String| {
        let kind = if partial {
            "weka-partial-tail"
        } else {
            "weka-full-block"
        };
        let mut nonce = 0u64;
        loop {
            let digest = blake3::hash(format!("{kind}\0{identity}\0{nonce}").as_bytes());
            let mut first = [0u8; 8];
            first.copy_from_slice(&digest.as_bytes()[..8]);
            let value = u64::from_le_bytes(first);
            match hashes.get(&value) {
                Some(held) if *held != identity => nonce += 1,
                Some(_) => return value,
                None => {
                    hashes.insert(value, identity);
                    return value;
                }
            }
        }
    };
    let mut out = Vec::with_capacity((full + 1) as usize);
    for i in 0..full {
        let mut identity = String::new();
        match c.hash_ids.get(i as usize) {
            Some(h) => write!(identity, "source:{source}:{h}"),
            None => write!(identity, "private:missing:{request_id}:{i}"),
        }
        .expect("a String takes any text");
        out.push(id(false, identity));
    }
    if !c.input.is_multiple_of(block) {
        out.push(id(true, format!("{request_id}:{full}:{}", c.input)));
    }
    out
}
