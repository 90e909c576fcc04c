//! The prefill-to-decode handoff of disaggregated serving, as the reference replay drives
//! it: a small state machine per request issues one action at a time, the simulation runs
//! the actions first in, first out, and facts (the source holds the KV, the destination has
//! room, the transfer is done) advance the machine.
//!
//! vLLM hands off *source first*: the prompt runs on a prefill worker until the request
//! finishes there (it generates every output token the workload planned, hidden, before
//! letting go); its KV is held; a decode worker is chosen and reserves room; the transfer
//! runs (the link model's delay, zero without one); the decode worker activates the request;
//! the prefill worker releases its copy. SGLang goes *destination first*: room on a decode
//! worker is reserved before the prefill is submitted.
//!
//! An action that needs a worker between passes (activation on the decode side, release on
//! the prefill side) waits for that worker's pass to end, then rejoins the queue.

use std::collections::VecDeque;

use super::engine::RequestId;

/// Which side of a handoff is set up first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandoffOrder {
    /// vLLM: prefill, then find room on a decode worker.
    SourceFirst,
    /// SGLang: room on a decode worker, then prefill.
    DestinationFirst,
}

/// One step of a handoff for the simulation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Route the prompt to a prefill worker.
    SubmitPrefill,
    /// Route the request to a decode worker and ask it for room.
    ReserveDestination,
    /// Start moving `tokens` prompt tokens of KV.
    StartTransfer { tokens: u32 },
    /// The KV arrived: the decode worker takes the request.
    ActivateDestination,
    /// The prefill worker frees its copy.
    ReleaseSource,
}

/// Where one request's handoff stands.
#[derive(Clone, Debug)]
pub struct Handoff {
    order: HandoffOrder,
    submitted: bool,
    held: bool,
    reserve_issued: bool,
    /// Prompt tokens the reservation found missing on the decode worker.
    reserved: Option<u32>,
    prompt_tokens: u32,
    full_prompt: bool,
    transfer_issued: bool,
    transferred: bool,
    activation_issued: bool,
    activated: bool,
    release_issued: bool,
}

impl Handoff {
    /// A handoff for a prompt of `prompt_tokens`; `full_prompt`: the transfer moves the whole
    /// prompt, not only what the decode worker lacks.
    pub fn new(order: HandoffOrder, prompt_tokens: u32, full_prompt: bool) -> Handoff {
        Handoff {
            order,
            submitted: false,
            held: false,
            reserve_issued: false,
            reserved: None,
            prompt_tokens,
            full_prompt,
            transfer_issued: false,
            transferred: false,
            activation_issued: false,
            activated: false,
            release_issued: false,
        }
    }

    /// The first action.
    pub fn start(&mut self) -> Action {
        match self.order {
            HandoffOrder::SourceFirst => {
                self.submitted = true;
                Action::SubmitPrefill
            }
            HandoffOrder::DestinationFirst => {
                self.reserve_issued = true;
                Action::ReserveDestination
            }
        }
    }

    /// The prefill worker finished the request and holds its KV.
    pub fn on_held(&mut self) -> Option<Action> {
        self.held = true;
        self.advance()
    }

    /// The decode worker set room aside; `missing_tokens` of the prompt it lacked.
    pub fn on_reserved(&mut self, missing_tokens: u32) -> Option<Action> {
        self.reserved = Some(missing_tokens);
        self.advance()
    }

    pub fn on_transferred(&mut self) -> Option<Action> {
        self.transferred = true;
        self.advance()
    }

    pub fn on_activated(&mut self) -> Option<Action> {
        self.activated = true;
        self.advance()
    }

    /// The prefill worker holds the request's KV and has not been told to free it.
    pub fn is_held(&self) -> bool {
        self.held && !self.release_issued
    }

    fn advance(&mut self) -> Option<Action> {
        if self.order == HandoffOrder::SourceFirst && self.held && !self.reserve_issued {
            self.reserve_issued = true;
            return Some(Action::ReserveDestination);
        }
        if self.order == HandoffOrder::DestinationFirst
            && self.reserved.is_some()
            && !self.submitted
        {
            self.submitted = true;
            return Some(Action::SubmitPrefill);
        }
        if let (true, Some(missing), false) = (self.held, self.reserved, self.transfer_issued) {
            self.transfer_issued = true;
            let tokens = if self.full_prompt {
                self.prompt_tokens
            } else {
                missing
            };
            return Some(Action::StartTransfer { tokens });
        }
        if self.transferred && !self.activation_issued {
            self.activation_issued = true;
            return Some(Action::ActivateDestination);
        }
        if self.activated && !self.release_issued {
            self.release_issued = true;
            return Some(Action::ReleaseSource);
        }
        None
    }
}

/// The actions of every handoff: one queue run first in, first out, and per-worker lists of
/// actions waiting for a pass to end.
#[derive(Default)]
pub struct ActionQueue {
    pending: VecDeque<(RequestId, Action)>,
    /// `[pool][worker]`: actions deferred until that worker's pass ends.
    deferred: Vec<Vec<VecDeque<(RequestId, Action)>>>,
}

impl ActionQueue {
    pub fn new(workers_per_pool: &[usize]) -> ActionQueue {
        ActionQueue {
            pending: VecDeque::new(),
            deferred: workers_per_pool
                .iter()
                .map(|&n| (0..n).map(|_| VecDeque::new()).collect())
                .collect(),
        }
    }

    pub fn push(&mut self, id: RequestId, action: Option<Action>) {
        if let Some(a) = action {
            self.pending.push_back((id, a));
        }
    }

    pub fn pop(&mut self) -> Option<(RequestId, Action)> {
        self.pending.pop_front()
    }

    pub fn defer(&mut self, pool: usize, worker: usize, id: RequestId, action: Action) {
        self.deferred[pool][worker].push_back((id, action));
    }

    /// A pass of `worker` ended: what waited on it rejoins the queue.
    pub fn wake(&mut self, pool: usize, worker: usize) {
        if let Some(list) = self.deferred.get_mut(pool).and_then(|p| p.get_mut(worker)) {
            self.pending.append(list);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Actions wait for a pass of `worker` of `pool` to end.
    pub fn waits_on(&self, pool: usize, worker: usize) -> bool {
        self.deferred
            .get(pool)
            .and_then(|p| p.get(worker))
            .is_some_and(|list| !list.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_first_prefills_then_reserves_transfers_activates_and_releases() {
        let mut h = Handoff::new(HandoffOrder::SourceFirst, 1000, true);
        assert_eq!(h.start(), Action::SubmitPrefill);
        assert_eq!(h.on_held(), Some(Action::ReserveDestination));
        assert_eq!(
            h.on_reserved(200),
            Some(Action::StartTransfer { tokens: 1000 })
        );
        assert_eq!(h.on_transferred(), Some(Action::ActivateDestination));
        assert_eq!(h.on_activated(), Some(Action::ReleaseSource));
    }

    #[test]
    fn destination_first_reserves_before_the_prefill_and_can_move_only_the_missing_part() {
        let mut h = Handoff::new(HandoffOrder::DestinationFirst, 1000, false);
        assert_eq!(h.start(), Action::ReserveDestination);
        assert_eq!(h.on_reserved(256), Some(Action::SubmitPrefill));
        assert_eq!(h.on_held(), Some(Action::StartTransfer { tokens: 256 }));
    }
}
