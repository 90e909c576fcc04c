//! The `request` span tree of one benchmark request (see [`kvtrace_otel`]), on the wall clock
//! as the run measured it: each entry read is an `mp.retrieve` span (its tier, or `miss`),
//! each entry written an `mp.store`, and the generation time `kvtrace.generation`. The root
//! carries LMCache's `hit_tokens` (the tokens its prefix reads found: system prompt, earlier
//! turns, documents), `requested_tokens` (those plus the tokens of the request's own entry,
//! the prompt it computed) and `hit_rate`, and `kvtrace.hit_tier` names the tiers that served
//! those reads.

use std::collections::BTreeSet;
use std::time::Instant;

use super::tiers::TierKind;
use kvtrace_cache::clock::wall_secs;
use kvtrace_otel::{Attr, RequestSpan, Span};
use kvtrace_report::units::fraction;

/// What one request did, gathered while it is served; does nothing when spans are off.
pub struct Trail {
    on: bool,
    start: f64,
    children: Vec<Span>,
    hit_tokens: u64,
    tiers: BTreeSet<&'static str>,
}

impl Trail {
    /// A trail from the moment the request was submitted; `on` false records nothing.
    pub fn new(on: bool, submitted: Instant) -> Trail {
        let start = if on {
            wall_secs() - submitted.elapsed().as_secs_f64()
        } else {
            0.0
        };
        Trail {
            on,
            start,
            children: Vec::new(),
            hit_tokens: 0,
            tiers: BTreeSet::new(),
        }
    }

    /// The wall time now, when the trail records (0 otherwise: no clock read).
    pub fn now(&self) -> f64 {
        if self.on {
            wall_secs()
        } else {
            0.0
        }
    }

    /// A read that began at `began`: found in `tier` with `tokens` tokens, or missed. Only a
    /// `prefill` read (a prefix the request reuses) adds to the hit; the decode reads of the
    /// request's own entry do not.
    pub fn read(
        &mut self,
        began: f64,
        entry: &'static str,
        hit: Option<(TierKind, u64)>,
        prefill: bool,
    ) {
        if !self.on {
            return;
        }
        let tier = hit.map_or("miss", |(tier, _)| tier.name());
        if let (Some((tier, tokens)), true) = (hit, prefill) {
            self.hit_tokens += tokens;
            self.tiers.insert(tier.name());
        }
        self.children.push(
            Span::new("mp.retrieve", began, wall_secs())
                .with("kvtrace.entry", Attr::Str(entry.into()))
                .with("kvtrace.tier", Attr::Str(tier.into())),
        );
    }

    /// A write of `tokens` tokens that began at `began`, landing in `tier` (`None`: it was
    /// there already, or no tier had room).
    pub fn write(&mut self, began: f64, tokens: u64, tier: Option<TierKind>) {
        if !self.on {
            return;
        }
        self.children.push(
            Span::new("mp.store", began, wall_secs())
                .with("kvtrace.tokens", Attr::Int(int(tokens)))
                .with(
                    "kvtrace.tier",
                    Attr::Str(tier.map_or("none", TierKind::name).into()),
                ),
        );
    }

    /// The generation time, from `began` to now.
    pub fn generation(&mut self, began: f64) {
        if self.on {
            self.children
                .push(Span::new("kvtrace.generation", began, wall_secs()));
        }
    }

    /// The request's span tree: `id` its name, `computed` the tokens of its own entry (the
    /// prompt no read served). What it requested is what the reads served plus that.
    pub fn finish(self, id: &str, computed: u64) -> RequestSpan {
        let hit = self.hit_tokens;
        let requested = hit + computed;
        let rate = fraction(hit, requested);
        let tiers: Vec<&str> = self.tiers.into_iter().collect();
        let tier = if tiers.is_empty() {
            "none".to_owned()
        } else {
            tiers.join("+")
        };
        let root = Span::new("request", self.start, self.start)
            .with("session_id", Attr::Str(id.to_owned()))
            .with("hit_tokens", Attr::Int(int(hit)))
            .with("requested_tokens", Attr::Int(int(requested)))
            .with("hit_rate", Attr::Float(rate))
            .with("kvtrace.hit_tier", Attr::Str(tier));
        let mut request = RequestSpan {
            root,
            children: Vec::new(),
        };
        for child in self.children {
            request.push(child);
        }
        request
    }
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
