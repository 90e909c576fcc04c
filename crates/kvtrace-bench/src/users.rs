//! Simulated users of a KV-cache benchmark: each has a persona (chatbot, coding, document),
//! a QoS level and a fixed request shape drawn once; its requests vary around that shape and
//! form multi-turn conversations. Every user draws from its own generator seeded by
//! `(seed, user id)`, so the request sequence of a user is the same in every run whatever
//! the thread scheduling.

use kvtrace_io::rng::SplitMix64;

/// What kind of traffic a user sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persona {
    Chatbot,
    Coding,
    Document,
}

/// Which persona ranges to use: today's, or the smaller January 2026 ones that earlier
/// published results were measured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PersonaSet {
    #[default]
    Current,
    January2026,
}

impl PersonaSet {
    /// The longest prompt any user of this set can send.
    pub fn max_context_tokens(self) -> u64 {
        Persona::ALL
            .iter()
            .map(|p| p.ranges(self).context_tokens.1)
            .max()
            .unwrap_or(0)
    }
}

/// The ranges a user's fixed shape is drawn from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PersonaRanges {
    pub context_tokens: (u64, u64),
    pub generation_tokens: (u64, u64),
    pub think_time_s: (f64, f64),
}

impl Persona {
    pub const ALL: [Persona; 3] = [Persona::Chatbot, Persona::Coding, Persona::Document];

    pub fn name(self) -> &'static str {
        match self {
            Persona::Chatbot => "chatbot",
            Persona::Coding => "coding",
            Persona::Document => "document",
        }
    }

    pub fn ranges(self, set: PersonaSet) -> PersonaRanges {
        let (context_tokens, generation_tokens, think_time_s) = match (self, set) {
            (Persona::Chatbot, PersonaSet::Current) => ((512, 4096), (50, 200), (0.1, 0.5)),
            (Persona::Coding, PersonaSet::Current) => ((4096, 25000), (100, 500), (0.2, 1.0)),
            (Persona::Document, PersonaSet::Current) => ((4096, 16384), (200, 800), (0.3, 1.5)),
            (Persona::Chatbot, PersonaSet::January2026) => ((256, 1024), (50, 150), (0.1, 0.5)),
            (Persona::Coding, PersonaSet::January2026) => ((1024, 4096), (100, 500), (0.2, 1.0)),
            (Persona::Document, PersonaSet::January2026) => ((2048, 8192), (200, 800), (0.3, 1.5)),
        };
        PersonaRanges {
            context_tokens,
            generation_tokens,
            think_time_s,
        }
    }
}

/// Service classes, most urgent first. A request's end-to-end latency is held against its
/// class's targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QosLevel {
    Interactive,
    Responsive,
    Batch,
}

impl QosLevel {
    pub const ALL: [QosLevel; 3] = [QosLevel::Interactive, QosLevel::Responsive, QosLevel::Batch];

    pub fn name(self) -> &'static str {
        match self {
            QosLevel::Interactive => "interactive",
            QosLevel::Responsive => "responsive",
            QosLevel::Batch => "batch",
        }
    }

    /// Higher is served first.
    pub fn priority(self) -> u8 {
        match self {
            QosLevel::Interactive => 3,
            QosLevel::Responsive => 2,
            QosLevel::Batch => 1,
        }
    }

    /// Latency targets in ms at P95, P99, P99.9 and P99.99.
    pub fn targets_ms(self) -> [f64; 4] {
        match self {
            QosLevel::Interactive => [50.0, 100.0, 150.0, 200.0],
            QosLevel::Responsive => [100.0, 200.0, 350.0, 500.0],
            QosLevel::Batch => [1000.0, 5000.0, 7500.0, 10000.0],
        }
    }

    /// 15 % interactive, 35 % responsive, 50 % batch.
    fn assign(u: f64) -> QosLevel {
        if u < 0.15 {
            QosLevel::Interactive
        } else if u < 0.50 {
            QosLevel::Responsive
        } else {
            QosLevel::Batch
        }
    }
}

/// What a request does to the cache: a prompt this long is only written (no decode reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    PrefillDecode,
}

impl Phase {
    /// The phase of a prompt this long.
    pub fn of(context_tokens: u64) -> Phase {
        if context_tokens >= PREFILL_ONLY_CONTEXT {
            Phase::Prefill
        } else {
            Phase::PrefillDecode
        }
    }
}

/// Prompts of at least this many tokens are prefill-only.
pub const PREFILL_ONLY_CONTEXT: u64 = 10_000;
/// Shared system prompts, and the chance a request starts with one.
pub const SYSTEM_PROMPTS: u8 = 3;
const SYSTEM_PROMPT_SHARE: f64 = 0.2;
/// Chance that a user ends its conversation before a request.
const END_CONVERSATION: f64 = 0.2;
/// A conversation never has more turns than this.
pub const MAX_TURNS: u32 = 50;

/// A user's fixed shape.
#[derive(Clone, Debug, PartialEq)]
pub struct UserProfile {
    pub id: u32,
    pub persona: Persona,
    pub qos: QosLevel,
    pub context_tokens: u64,
    pub generation_tokens: u64,
    pub think_time_s: f64,
}

/// One request of a user.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub user: u32,
    pub qos: QosLevel,
    /// The user's conversation counter (0, 1, ...).
    pub conversation: u64,
    /// 1 for a conversation's first request.
    pub turn: u32,
    pub context_tokens: u64,
    pub generation_tokens: u64,
    pub phase: Phase,
    /// Seconds the user thinks before sending it.
    pub think_s: f64,
    /// One of the shared system prompts it starts with, if any (one request in five).
    pub system_prompt: Option<u8>,
    /// When a replayed log sends it, in seconds from the start of the run.
    pub at_s: Option<f64>,
}

/// The request stream of one user.
#[derive(Clone, Debug)]
pub struct UserStream {
    profile: UserProfile,
    rng: SplitMix64,
    multi_turn: bool,
    conversation: u64,
    turn: u32,
}

fn uniform(rng: &mut SplitMix64, (lo, hi): (u64, u64)) -> u64 {
    rng.range(lo, hi.max(lo))
}

impl UserStream {
    pub fn new(seed: u64, id: u32, set: PersonaSet, multi_turn: bool) -> UserStream {
        let mut rng = SplitMix64::new(seed ^ 0x6b76_6265_6e63_6800 ^ (u64::from(id) << 20));
        // Warm the stream so neighbouring ids do not start from correlated states.
        rng.next_u64();
        let persona = Persona::ALL[rng.range(0, 2) as usize];
        let qos = QosLevel::assign(rng.next_f64());
        let r = persona.ranges(set);
        let context_tokens = uniform(&mut rng, r.context_tokens);
        let generation_tokens = uniform(&mut rng, r.generation_tokens);
        let (lo, hi) = r.think_time_s;
        let think_time_s = lo + (hi - lo) * rng.next_f64();
        UserStream {
            profile: UserProfile {
                id,
                persona,
                qos,
                context_tokens,
                generation_tokens,
                think_time_s,
            },
            rng,
            multi_turn,
            conversation: 0,
            turn: 0,
        }
    }

    pub fn profile(&self) -> &UserProfile {
        &self.profile
    }

    /// The next request: a new turn of the current conversation, or the first of a new one
    /// (one in five, always after 50 turns, always without multi-turn).
    pub fn next_request(&mut self) -> Request {
        let ends = self.rng.next_f64() < END_CONVERSATION;
        if self.turn > 0 && (!self.multi_turn || ends || self.turn >= MAX_TURNS) {
            self.conversation += 1;
            self.turn = 0;
        }
        self.turn += 1;
        let p = &self.profile;
        let context_tokens = uniform(&mut self.rng, (p.context_tokens / 4, p.context_tokens));
        let generation_tokens = uniform(
            &mut self.rng,
            (p.generation_tokens / 4, p.generation_tokens),
        );
        let think_s = p.think_time_s * (0.8 + 0.4 * self.rng.next_f64());
        let system_prompt = (self.rng.next_f64() < SYSTEM_PROMPT_SHARE)
            .then(|| self.rng.range(0, u64::from(SYSTEM_PROMPTS) - 1) as u8);
        Request {
            user: p.id,
            qos: p.qos,
            conversation: self.conversation,
            turn: self.turn,
            context_tokens,
            generation_tokens,
            phase: Phase::of(context_tokens),
            think_s,
            system_prompt,
            at_s: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(seed: u64, user: u32, n: usize) -> Vec<Request> {
        let mut s = UserStream::new(seed, user, PersonaSet::Current, true);
        (0..n).map(|_| s.next_request()).collect()
    }

    #[test]
    fn a_seed_gives_every_user_the_same_requests() {
        assert_eq!(requests(7, 3, 200), requests(7, 3, 200));
        assert_ne!(requests(7, 3, 50), requests(7, 4, 50));
        assert_ne!(requests(7, 3, 50), requests(8, 3, 50));
    }

    #[test]
    fn requests_stay_within_the_persona_ranges_and_follow_the_phase_rule() {
        for user in 0..200 {
            let stream = UserStream::new(1, user, PersonaSet::Current, true);
            let p = stream.profile().clone();
            let r = p.persona.ranges(PersonaSet::Current);
            assert!((r.context_tokens.0..=r.context_tokens.1).contains(&p.context_tokens));
            for q in requests(1, user, 30) {
                assert!(
                    q.context_tokens >= p.context_tokens / 4
                        && q.context_tokens <= p.context_tokens
                );
                assert!(q.think_s >= 0.8 * p.think_time_s && q.think_s <= 1.2 * p.think_time_s);
                assert_eq!(
                    q.phase == Phase::Prefill,
                    q.context_tokens >= PREFILL_ONLY_CONTEXT
                );
                assert!((1..=MAX_TURNS).contains(&q.turn));
            }
        }
    }

    #[test]
    fn qos_classes_come_in_the_configured_shares() {
        let mut counts = [0u32; 3];
        for user in 0..20_000 {
            let qos = UserStream::new(5, user, PersonaSet::Current, true)
                .profile()
                .qos;
            counts[qos as usize] += 1;
        }
        let share = |i: usize| f64::from(counts[i]) / 20_000.0;
        assert!((share(0) - 0.15).abs() < 0.015, "{counts:?}");
        assert!((share(1) - 0.35).abs() < 0.015, "{counts:?}");
        assert!((share(2) - 0.50).abs() < 0.015, "{counts:?}");
    }

    #[test]
    fn without_multi_turn_every_request_starts_a_conversation() {
        let mut s = UserStream::new(2, 0, PersonaSet::January2026, false);
        for i in 0..20 {
            let q = s.next_request();
            assert_eq!((q.turn, q.conversation), (1, i));
        }
    }
}
