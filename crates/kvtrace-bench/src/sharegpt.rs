//! ShareGPT conversations as benchmark requests (`--dataset-path`): each human message
//! followed by a gpt message is one request, its prompt and answer counted in `cl100k_base`
//! tokens (tiktoken) and clipped to 16,384 and 2,048 tokens. A conversation whose messages
//! never pair that way (it starts with the gpt side, or carries system turns between) gives
//! no request; the loader counts those and says so, rather than silently shrinking the run.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::users::{Phase, QosLevel, Request};
use kvtrace_io::error::{json_reason, Error, Result};
use kvtrace_io::limits::{read_text, MAX_DATASET_BYTES};
use kvtrace_io::rng::SplitMix64;

/// Longest prompt and answer a ShareGPT request keeps.
pub const MAX_CONTEXT_TOKENS: u64 = 16_384;
pub const MAX_GENERATION_TOKENS: u64 = 2_048;

#[derive(Deserialize)]
struct Message {
    from: String,
    value: String,
}

#[derive(Deserialize)]
struct Conversation {
    #[serde(default)]
    conversations: Vec<Message>,
}

/// One human → gpt exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub context_tokens: u64,
    pub generation_tokens: u64,
}

/// The usable conversations of a file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dataset {
    /// Each conversation's exchanges, in order; never empty.
    pub conversations: Vec<Vec<Exchange>>,
    /// Conversations read (at most the limit asked for).
    pub read: usize,
    /// Of those, how many had no human → gpt pair.
    pub unpaired: usize,
}

impl Dataset {
    /// A one-line account of what could not be used, if anything.
    pub fn warning(&self) -> Option<String> {
        (self.unpaired > 0).then(|| {
            format!(
                "{} of {} conversations have no human message followed by a gpt message \
                 (they start with gpt, or system turns sit between) and give no request",
                self.unpaired, self.read
            )
        })
    }
}

/// One user's share of a dataset: conversations `i` with `i % users == user` of a seeded
/// shuffle, turn by turn, passed over `cycles` times (0: without end).
pub struct DatasetStream {
    dataset: Arc<Dataset>,
    user: u32,
    qos: QosLevel,
    mine: Vec<usize>,
    next: usize,
    turn: usize,
    conversation: u64,
    cycles: u32,
    passes: u32,
}

impl DatasetStream {
    pub fn new(
        dataset: Arc<Dataset>,
        seed: u64,
        user: u32,
        users: u32,
        qos: QosLevel,
        cycles: u32,
    ) -> DatasetStream {
        let mut order: Vec<usize> = (0..dataset.conversations.len()).collect();
        let mut rng = SplitMix64::new(seed ^ 0x7368_6172_6567_7074);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.range(0, i as u64) as usize);
        }
        let mine = order
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i as u64 % u64::from(users.max(1)) == u64::from(user))
            .map(|(_, c)| c)
            .collect();
        DatasetStream {
            dataset,
            user,
            qos,
            mine,
            next: 0,
            turn: 0,
            conversation: 0,
            cycles,
            passes: 0,
        }
    }

    /// The next exchange as a request; `None` when this user's share is done.
    pub fn next_request(&mut self) -> Option<Request> {
        if self.mine.is_empty() {
            return None;
        }
        if self.next == self.mine.len() {
            self.passes += 1;
            if self.cycles > 0 && self.passes >= self.cycles {
                return None;
            }
            self.next = 0;
        }
        let exchanges = &self.dataset.conversations[self.mine[self.next]];
        let e = exchanges[self.turn];
        self.turn += 1;
        let turn = self.turn as u32;
        let conversation = self.conversation;
        if self.turn == exchanges.len() {
            self.turn = 0;
            self.next += 1;
            self.conversation += 1;
        }
        Some(Request {
            user: self.user,
            qos: self.qos,
            conversation,
            turn,
            context_tokens: e.context_tokens,
            generation_tokens: e.generation_tokens,
            phase: Phase::of(e.context_tokens),
            think_s: 0.0,
            system_prompt: None,
            at_s: None,
        })
    }
}

/// Pairs each `human` message with the `gpt` message right after it.
fn exchanges(messages: &[Message], tokens: &dyn Fn(&str) -> u64) -> Vec<Exchange> {
    messages
        .windows(2)
        .filter(|w| w[0].from == "human" && w[1].from == "gpt")
        .map(|w| Exchange {
            context_tokens: tokens(&w[0].value).clamp(1, MAX_CONTEXT_TOKENS),
            generation_tokens: tokens(&w[1].value).clamp(1, MAX_GENERATION_TOKENS),
        })
        .collect()
}

/// Counts a text's tokens as kv-cache.py does: `cl100k_base`, special tokens as text.
#[cfg(feature = "tiktoken")]
fn token_counter() -> Result<impl Fn(&str) -> u64> {
    let bpe = tiktoken_rs::cl100k_base().map_err(|e| {
        Error::io(
            "cannot load the cl100k_base tokenizer",
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(move |text: &str| bpe.encode_ordinary(text).len() as u64)
}

#[cfg(not(feature = "tiktoken"))]
fn token_counter() -> Result<fn(&str) -> u64> {
    Err(Error::usage(
        "a ShareGPT dataset needs a kvtrace built with the `tiktoken` feature (it counts cl100k_base tokens)",
    ))
}

/// Reads the first `max_conversations` conversations of a ShareGPT JSON file.
///
/// Only those conversations are parsed into memory: the public dataset is a list of about
/// 90,000 conversations in some 640 MB, of which a run takes 500 by default, and parsing it
/// whole held gigabytes. The rest of the list is still checked, without being kept, so that a damaged
/// file is refused however far in the damage is, as kv-cache.py (which loads the file
/// whole) refuses it. The text is read whole rather than parsed as it is read: serde_json
/// places some errors a column late when it parses a stream.
pub fn load(path: &Path, max_conversations: usize) -> Result<Dataset> {
    let shown = path.display().to_string();
    let text = read_text(path, MAX_DATASET_BYTES)
        .map_err(|e| Error::io("cannot read the dataset", e).in_file(&shown))?;
    let tokens = token_counter()?;
    let mut dataset = Dataset::default();
    let mut json = serde_json::Deserializer::from_str(&text);
    FirstConversations {
        max: max_conversations,
        tokens: &tokens,
        dataset: &mut dataset,
    }
    .deserialize(&mut json)
    .and_then(|()| json.end())
    .map_err(|e| {
        let reason = json_reason(&e);
        Error::line(
            e.line() as u64,
            format!("column {}", e.column()),
            format!(
                "not a ShareGPT list of {{\"conversations\": [{{\"from\", \"value\"}}]}}: {reason}"
            ),
        )
        .in_file(&shown)
    })?;
    Ok(dataset)
}

/// The list of a ShareGPT file, its first `max` conversations paired into `dataset` as they
/// are parsed and the rest checked to their end without being kept.
struct FirstConversations<'a> {
    max: usize,
    tokens: &'a dyn Fn(&str) -> u64,
    dataset: &'a mut Dataset,
}

impl<'de> DeserializeSeed<'de> for FirstConversations<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for FirstConversations<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut list: A) -> std::result::Result<(), A::Error> {
        while self.dataset.read < self.max {
            let Some(conversation) = list.next_element::<Conversation>()? else {
                return Ok(());
            };
            self.dataset.read += 1;
            let pairs = exchanges(&conversation.conversations, self.tokens);
            if pairs.is_empty() {
                self.dataset.unpaired += 1;
            } else {
                self.dataset.conversations.push(pairs);
            }
        }
        while list.next_element::<Unkept>()?.is_some() {}
        Ok(())
    }
}

/// A conversation past those kept, checked for the same shape as [`Conversation`] with
/// nothing held: its messages are of no size, and their texts are read and let go.
#[derive(Deserialize)]
struct Unkept {
    #[serde(default, rename = "conversations")]
    _conversations: Vec<UnkeptMessage>,
}

#[derive(Deserialize)]
struct UnkeptMessage {
    #[serde(rename = "from")]
    _from: Text,
    #[serde(rename = "value")]
    _value: Text,
}

/// A string, checked and not kept.
struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Text, D::Error> {
        deserializer.deserialize_str(Text)
    }
}

impl Visitor<'_> for Text {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Text, E> {
        Ok(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("tmp");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        f
    }

    #[cfg(feature = "tiktoken")]
    #[test]
    fn human_then_gpt_pairs_become_requests_and_the_rest_is_counted() {
        let f = write(
            r#"[
            {"conversations": [{"from": "human", "value": "Hello there, how are you?"},
                               {"from": "gpt", "value": "Fine."},
                               {"from": "human", "value": "And now?"},
                               {"from": "gpt", "value": "Still fine, thank you for asking."}]},
            {"conversations": [{"from": "gpt", "value": "I speak first."},
                               {"from": "human", "value": "Then I answer."}]},
            {"conversations": [{"from": "system", "value": "Be brief."},
                               {"from": "human", "value": "Hi"},
                               {"from": "gpt", "value": "Hi"}]},
            {"conversations": []}
        ]"#,
        );
        let d = load(f.path(), 10).expect("load");
        assert_eq!(d.read, 4);
        assert_eq!(d.conversations.len(), 2);
        assert_eq!(d.unpaired, 2);
        assert_eq!(d.conversations[0].len(), 2);
        assert_eq!(
            d.conversations[0][0],
            Exchange {
                context_tokens: 7,
                generation_tokens: 2
            },
            "cl100k_base: 'Hello there, how are you?' is 7 tokens, 'Fine.' 2"
        );
        assert!(d
            .warning()
            .expect("warning")
            .starts_with("2 of 4 conversations"));
        assert_eq!(load(f.path(), 1).expect("load").read, 1, "the limit holds");
    }

    #[test]
    fn users_share_the_conversations_and_replay_them_by_cycles() {
        let dataset = Arc::new(Dataset {
            conversations: (1..=5)
                .map(|n| {
                    vec![
                        Exchange {
                            context_tokens: n,
                            generation_tokens: 1,
                        };
                        2
                    ]
                })
                .collect(),
            read: 5,
            unpaired: 0,
        });
        let drain = |user: u32, cycles: u32| {
            let mut s = DatasetStream::new(dataset.clone(), 9, user, 2, QosLevel::Batch, cycles);
            std::iter::from_fn(|| s.next_request()).collect::<Vec<_>>()
        };
        let (a, b) = (drain(0, 1), drain(1, 1));
        assert_eq!(a.len() + b.len(), 10, "every exchange once");
        assert_eq!((a[0].turn, a[1].turn), (1, 2));
        assert_eq!(drain(0, 3).len(), 3 * a.len());
        assert_eq!(drain(0, 1), a, "the seed fixes the order");
    }

    #[cfg(not(feature = "tiktoken"))]
    #[test]
    fn a_dataset_without_the_tokenizer_is_a_usage_error() {
        let f = write(r#"[{"conversations": []}]"#);
        let e = load(f.path(), 10).expect_err("no tokenizer");
        assert_eq!(e.exit_code(), kvtrace_io::error::EXIT_USAGE);
        assert!(e.to_string().contains("`tiktoken` feature"), "{e}");
    }

    #[cfg(feature = "tiktoken")]
    #[test]
    fn a_file_that_is_not_sharegpt_is_a_one_line_error_with_its_position() {
        let f = write("[{\"conversations\": 3}]");
        let e = load(f.path(), 10).expect_err("not a list").to_string();
        assert!(
            e.contains("line 1: column 20: not a ShareGPT list") && !e.contains('\n'),
            "{e}"
        );
        // Past the conversations kept, the list is still checked to its end.
        let f = write("[{\"conversations\": []},\n{\"conversations\": 3}]");
        let e = load(f.path(), 1)
            .expect_err("damaged past the limit")
            .to_string();
        assert!(e.contains("line 2: column 19: not a ShareGPT list"), "{e}");
        let f = write("[{\"conversations\": []},\n{\"conversations\": []}] x");
        let e = load(f.path(), 1).expect_err("trailing").to_string();
        assert!(e.contains("line 2: column 24: not a ShareGPT list"), "{e}");
        let missing = load(Path::new("/no/such/sharegpt.json"), 10).expect_err("missing");
        assert!(missing.to_string().contains("/no/such/sharegpt.json"));
    }
}
