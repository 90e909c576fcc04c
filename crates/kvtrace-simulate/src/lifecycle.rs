//! AISimulate's agentic lifecycle transcript, rebuilt from a run: the events its driver
//! records for a request graph — each request's dispatch, causal terminal and quiescence,
//! the requests a play's first failure skips, each play's settling — in the driver's order,
//! and the digest its report gives as `agentic_lifecycle_digest` (schema
//! `aisimulate.agentic.lifecycle.v1`: one JSON object a line, BLAKE3 over a domain tag and
//! the lines).
//!
//! The order, read from `aisimulate-core` 0.13.0's driver and checked against its engine:
//! events by time; at one time, first the terminals of requests sent earlier, then the
//! dispatches, then the terminals of requests sent at that time (a rejection on arrival).
//! A batch of terminals at one time gives every causal terminal (a play's first rejection
//! followed by its skipped requests), then every quiescence (the one that leaves its play
//! with nothing running and nothing to send followed by the play's settling), each in the
//! graph's request order.

use serde::Serialize;

use crate::collector::Status;

const SCHEMA: &str = "aisimulate.agentic.lifecycle.v1";
const DIGEST_DOMAIN: &[u8] = b"aisimulate-agentic-lifecycle-v1\0";

/// One request of the graph as the run left it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub play: u32,
    /// When it was sent, and when and how it ended; `None` when it never was.
    pub sent: Option<(f64, Option<(f64, Status)>)>,
    /// Never sent because a request of its play was rejected.
    pub skipped: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Dispatch,
    CausalTerminal,
    Quiescent,
    Skipped,
    PlayQuiescent,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    pub at_ms: f64,
    pub play: u32,
    /// The request (its node), for every kind but a play's settling.
    pub node: Option<u32>,
    pub kind: Kind,
    /// A causal terminal's status.
    pub status: Option<Status>,
}

/// The transcript of `nodes` (in the graph's request order) over `plays` plays.
pub fn events(nodes: &[Node], plays: usize) -> Vec<Event> {
    // (time, class, node, is a terminal): class 0 a terminal of a request sent earlier, 1 a
    // dispatch, 2 a terminal of a request sent at that time.
    let mut keyed: Vec<(f64, u8, u32, bool)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let Some((sent, end)) = n.sent else { continue };
        keyed.push((sent, 1, i as u32, false));
        if let Some((at, _)) = end {
            keyed.push((at, if at > sent { 0 } else { 2 }, i as u32, true));
        }
    }
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); plays];
    for (i, n) in nodes.iter().enumerate() {
        if let Some(m) = members.get_mut(n.play as usize) {
            m.push(i as u32);
        }
    }
    let mut failed = vec![false; plays];
    let mut running = vec![0usize; plays];
    let mut completed = vec![0usize; plays];
    let mut out = Vec::with_capacity(keyed.len() * 2);
    let mut at = 0;
    while at < keyed.len() {
        let (t, class, node, terminal) = keyed[at];
        let play = nodes[node as usize].play;
        if !terminal {
            running[play as usize] += 1;
            out.push(Event {
                at_ms: t,
                play,
                node: Some(node),
                kind: Kind::Dispatch,
                status: None,
            });
            at += 1;
            continue;
        }
        let batch = keyed[at..]
            .iter()
            .take_while(|k| k.3 && k.0.total_cmp(&t).is_eq() && k.1 == class)
            .count();
        let batch = &keyed[at..at + batch];
        for &(_, _, node, _) in batch {
            let n = &nodes[node as usize];
            let status = n.sent.and_then(|(_, end)| end).map(|(_, s)| s);
            out.push(Event {
                at_ms: t,
                play: n.play,
                node: Some(node),
                kind: Kind::CausalTerminal,
                status,
            });
            let p = n.play as usize;
            if status == Some(Status::Completed) {
                completed[p] += 1;
            } else if !std::mem::replace(&mut failed[p], true) {
                for &m in members[p].iter().filter(|&&m| nodes[m as usize].skipped) {
                    out.push(Event {
                        at_ms: t,
                        play: n.play,
                        node: Some(m),
                        kind: Kind::Skipped,
                        status: None,
                    });
                }
            }
        }
        for &(_, _, node, _) in batch {
            let play = nodes[node as usize].play;
            let p = play as usize;
            out.push(Event {
                at_ms: t,
                play,
                node: Some(node),
                kind: Kind::Quiescent,
                status: None,
            });
            running[p] -= 1;
            if running[p] == 0 && (failed[p] || completed[p] == members[p].len()) {
                out.push(Event {
                    at_ms: t,
                    play,
                    node: None,
                    kind: Kind::PlayQuiescent,
                    status: None,
                });
            }
        }
        at += batch.len();
    }
    out
}

/// One line of the transcript, its fields in AISimulate's order.
#[derive(Serialize)]
struct Line<'a> {
    schema: &'static str,
    ordinal: u64,
    at_ms: f64,
    play_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    event: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'static str>,
}

/// The transcript's digest, given each play's name and each node's request id.
pub fn digest(events: &[Event], play_names: &[String], request_ids: &[&str]) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(DIGEST_DOMAIN);
    let mut line = Vec::new();
    for (ordinal, e) in events.iter().enumerate() {
        line.clear();
        let record = Line {
            schema: SCHEMA,
            ordinal: ordinal as u64,
            at_ms: e.at_ms,
            play_id: play_names.get(e.play as usize).map_or("", String::as_str),
            request_id: e.node.and_then(|n| request_ids.get(n as usize).copied()),
            event: e.kind,
            status: e.status.map(Status::name),
        };
        serde_json::to_writer(&mut line, &record).expect("a line of plain fields");
        line.push(b'\n');
        hasher.update(&line);
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two plays: a, b and c (skipped) in play 0, d in play 1. a and d end together at 10,
    /// when b, released by a, is sent and rejected at once.
    #[test]
    fn terminals_before_dispatches_and_causes_before_quiescence_at_one_time() {
        let node = |play, sent, skipped| Node {
            play,
            sent,
            skipped,
        };
        let nodes = [
            node(0, Some((0.0, Some((10.0, Status::Completed)))), false),
            node(0, Some((10.0, Some((10.0, Status::Rejected)))), false),
            node(0, None, true),
            node(1, Some((5.0, Some((10.0, Status::Completed)))), false),
        ];
        let got: Vec<(f64, Kind, Option<u32>, u32)> = events(&nodes, 2)
            .iter()
            .map(|e| (e.at_ms, e.kind, e.node, e.play))
            .collect();
        use Kind::*;
        let want = vec![
            (0.0, Dispatch, Some(0), 0),
            (5.0, Dispatch, Some(3), 1),
            (10.0, CausalTerminal, Some(0), 0),
            (10.0, CausalTerminal, Some(3), 1),
            (10.0, Quiescent, Some(0), 0),
            (10.0, Quiescent, Some(3), 1),
            (10.0, PlayQuiescent, None, 1),
            (10.0, Dispatch, Some(1), 0),
            (10.0, CausalTerminal, Some(1), 0),
            (10.0, Skipped, Some(2), 0),
            (10.0, Quiescent, Some(1), 0),
            (10.0, PlayQuiescent, None, 0),
        ];
        assert_eq!(got, want);
    }

    /// A play with a request still running neither settles nor is skipped from.
    #[test]
    fn a_play_with_a_request_running_does_not_settle() {
        let nodes = [
            Node {
                play: 0,
                sent: Some((0.0, Some((4.0, Status::Completed)))),
                skipped: false,
            },
            Node {
                play: 0,
                sent: Some((1.0, None)),
                skipped: false,
            },
        ];
        let kinds: Vec<Kind> = events(&nodes, 1).iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Dispatch,
                Kind::Dispatch,
                Kind::CausalTerminal,
                Kind::Quiescent
            ]
        );
    }
}
