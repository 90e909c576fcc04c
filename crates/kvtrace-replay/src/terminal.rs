//! The terminal table: LMCache's "Trace Replay Result" layout (64 columns, label left, value
//! right), followed by the sections LMCache lacks.

use crate::lmct::calls::short_name;

use super::report::ReplayReport;
use crate::storage::TierIo;
use kvtrace_report::units::{bytes, percent as pct};

const WIDTH: usize = 64;

fn rule(title: &str, fill: char) -> String {
    if title.is_empty() {
        return fill.to_string().repeat(WIDTH) + "\n";
    }
    let title = format!(" {title} ");
    let left = (WIDTH.saturating_sub(title.len())) / 2;
    let right = WIDTH.saturating_sub(title.len() + left);
    format!(
        "{}{title}{}\n",
        fill.to_string().repeat(left),
        fill.to_string().repeat(right)
    )
}

fn row(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let label = format!("{label}:");
    let value = value.to_string();
    let pad = WIDTH.saturating_sub(label.len() + value.len()).max(1);
    out.push_str(&format!("{label}{}{value}\n", " ".repeat(pad)));
}

/// A row of several values: on one line where they fit, else the label alone and each value on
/// its own indented line, so no line runs past a 100-column terminal.
fn list(out: &mut String, label: &str, values: &[String]) {
    let joined = values.join(", ");
    if label.len() + 2 + joined.len() <= WIDTH {
        row(out, label, joined);
        return;
    }
    out.push_str(&format!("{label}:\n"));
    for value in values {
        out.push_str(&format!("  {value}\n"));
    }
}

/// `a / b`, for the requested-versus-hit style rows.
fn pair(a: impl std::fmt::Display, b: impl std::fmt::Display) -> String {
    format!("{a} / {b}")
}

/// Renders the report for a terminal: the answer first — what was replayed, where it differs
/// from the recording, the hit rate and how much of the recording it reproduced — then the
/// detail.
pub fn render(report: &ReplayReport) -> String {
    let mut s = rule("Trace Replay Result", '=');
    answer(&mut s, report);
    s.push_str(&rule("Overall", '-'));
    row(&mut s, "Trace level", &report.level);
    if let Some(r) = &report.rank {
        row(
            &mut s,
            "Rank",
            format!("{} of {} ({})", r.rank.rank, r.rank.world_size, r.shard),
        );
    }
    if report.interrupted {
        row(
            &mut s,
            "Interrupted",
            "yes: figures cover the records read so far",
        );
    }
    row(&mut s, "Records replayed", report.replayed);
    row(&mut s, "Records skipped", report.skipped);
    row(&mut s, "Records failed", report.failed);
    row(
        &mut s,
        "Replay duration (s)",
        format!("{:.2}", report.duration_s),
    );
    let d = &report.digest;
    let short = |h: &str| h.chars().take(8).collect::<String>();
    let digest = match d.result.as_str() {
        "match" => format!("match ({})", short(&d.run)),
        r => format!("{r} (rec={}, run={})", short(&d.recorded), short(&d.run)),
    };
    row(&mut s, "Config digest", digest);
    if !d.differing_paths.is_empty() {
        list(&mut s, "Config differs at", &d.differing_paths);
    }
    row(&mut s, "Pacing", &report.pacing);
    // Calls take microseconds in a replay: milliseconds with two decimals read 0.00.
    s.push_str(&rule("Per-Op Latency (µs): count, mean, p50, p99", '-'));
    for (q, op) in &report.ops {
        let mut value = format!(
            "{}, {:.1}, {:.1}, {:.1}",
            op.count,
            op.mean_ms * 1e3,
            op.p50_ms * 1e3,
            op.p99_ms * 1e3
        );
        if op.errors > 0 {
            value.push_str(&format!(" ({} errors)", op.errors));
        }
        row(&mut s, &short_name(q), value);
    }
    let h = &report.hits;
    s.push_str(&rule("Prefetch Hits", '-'));
    row(&mut s, "Requests", h.requests);
    row(
        &mut s,
        "Chunks requested / hit",
        pair(h.requested_chunks, h.hit_chunks),
    );
    row(
        &mut s,
        "Tokens requested / hit",
        pair(h.requested_tokens, h.hit_tokens),
    );
    let c = &report.calls;
    s.push_str(&rule("Storage", '-'));
    row(
        &mut s,
        "Keys reserved / not writable",
        pair(c.keys_reserved, c.keys_not_writable),
    );
    row(
        &mut s,
        "OUT_OF_MEMORY reservations (keys)",
        format!("{} ({})", c.out_of_memory_calls, c.out_of_memory_keys),
    );
    row(&mut s, "Reads that missed (keys gone)", c.read_failures);
    for t in &report.tiers {
        row(
            &mut s,
            &format!("{} {} written / read", t.name, t.backend),
            pair(bytes(t.bytes_written), bytes(t.bytes_read)),
        );
        row(
            &mut s,
            &format!("{} resident / peak", t.name),
            pair(bytes(t.resident_bytes), bytes(t.peak_bytes)),
        );
        row(
            &mut s,
            &format!("{} evictions", t.name),
            format!("{} ({})", t.evictions, bytes(t.bytes_evicted)),
        );
        if t.cross_rank_hits > 0 {
            row(
                &mut s,
                &format!("{} loads of other ranks' objects", t.name),
                t.cross_rank_hits,
            );
        }
        if t.write_errors + t.read_errors + t.delete_errors > 0 {
            row(
                &mut s,
                &format!("{} failed writes / reads / deletes", t.name),
                format!(
                    "{} / {} / {}",
                    t.write_errors, t.read_errors, t.delete_errors
                ),
            );
        }
    }
    for t in &report.tier_io {
        row(
            &mut s,
            &format!("{} write / read MiB/s", t.name),
            pair(
                format!("{:.0}", t.write_mib_per_s),
                format!("{:.0}", t.read_mib_per_s),
            ),
        );
        row(
            &mut s,
            &format!("{} mean load (ms)", t.name),
            format!("{:.3}", t.mean_load_ms),
        );
        calls(&mut s, t);
    }
    fidelity(&mut s, report);
    s.push_str(&rule("", '='));
    s
}

/// A tier's backend calls: where their time went (queue or device), and for asynchronous
/// I/O how far behind the trace it ran and how long it took to drain.
fn calls(s: &mut String, t: &TierIo) {
    let c = &t.calls;
    if t.mode == "modelled" || c.writes + c.reads + c.deletes == 0 {
        return;
    }
    let ms = |v: f64| format!("{v:.3}");
    if let (Some(depth), Some(workers)) = (t.queue_depth, t.workers) {
        row(
            s,
            &format!("{} I/O", t.name),
            format!("asynchronous, {workers} workers, {depth} queued calls"),
        );
        row(
            s,
            &format!("{} queue wait p50 / p99 (ms)", t.name),
            pair(ms(c.queue_wait_ms.p50_ms), ms(c.queue_wait_ms.p99_ms)),
        );
    }
    row(
        s,
        &format!("{} service p50 / p99 (ms)", t.name),
        pair(ms(c.service_ms.p50_ms), ms(c.service_ms.p99_ms)),
    );
    row(
        s,
        &format!("{} end to end p50 / p99 (ms)", t.name),
        pair(ms(c.end_to_end_ms.p50_ms), ms(c.end_to_end_ms.p99_ms)),
    );
    if let Some(lag) = &c.schedule_lag_ms {
        row(
            s,
            &format!("{} schedule lag p50 / p99 (ms)", t.name),
            pair(ms(lag.p50_ms), ms(lag.p99_ms)),
        );
    }
    if t.mode == "asynchronous" {
        row(
            s,
            &format!("{} waited for queue room / drain (s)", t.name),
            pair(
                format!("{:.3}", c.submit_stall_s),
                format!("{:.3}", c.drain_s),
            ),
        );
    }
}

/// What was replayed (and what the recording ran, where that differs), the hit rate and the
/// fidelity figure.
fn answer(s: &mut String, report: &ReplayReport) {
    s.push_str(&rule("Answer", '-'));
    for line in &report.configuration {
        let label = match line.what.as_str() {
            "L1" => "L1",
            "eviction" => "Eviction",
            _ => "L2",
        };
        row(s, label, &line.replayed);
        if let Some(recorded) = line.recorded.as_ref().filter(|_| line.differs()) {
            row(s, "  recorded", recorded);
        }
    }
    let c = &report.client;
    let mut client = format!("{} ({})", c.info.model.name(), c.info.source);
    if c.stores_added + c.stores_dropped + c.stores_resized > 0 {
        client.push_str(&format!(
            ": stores {} resized, {} added, {} dropped",
            c.stores_resized, c.stores_added, c.stores_dropped
        ));
    }
    row(s, "Client model", client);
    let h = &report.hits;
    row(
        s,
        "Hit rate (L1 + L2)",
        format!(
            "{} ({} + {})",
            pct(h.hit_rate),
            pct(h.l1_hit_rate),
            pct(h.l2_hit_rate)
        ),
    );
    let f = &report.fidelity;
    row(
        s,
        "Requests whose hits match the recording",
        format!(
            "{} / {} ({})",
            f.requests_matching,
            f.requests,
            pct(f.request_match_rate())
        ),
    );
    if f.recorded_hit_chunks > 0 || f.replayed_hit_chunks > 0 {
        row(
            s,
            "Chunks hit recorded / replayed",
            pair(f.recorded_hit_chunks, f.replayed_hit_chunks),
        );
    }
}

/// Recorded versus replayed, and the first divergences.
fn fidelity(s: &mut String, report: &ReplayReport) {
    let f = &report.fidelity;
    s.push_str(&rule("Fidelity (recorded vs replayed)", '-'));
    row(
        s,
        "Requests whose hits match",
        format!(
            "{} / {} ({})",
            f.requests_matching,
            f.requests,
            pct(f.request_match_rate())
        ),
    );
    row(
        s,
        "Chunks hit recorded / replayed",
        format!(
            "{} / {} (L1 {}, L2 {})",
            f.recorded_hit_chunks,
            f.replayed_hit_chunks,
            f.replayed_l1_hit_chunks,
            f.replayed_l2_hit_chunks
        ),
    );
    row(
        s,
        "Stores whose reservation matches",
        pair(f.stores_matching, f.stores),
    );
    row(
        s,
        "Keys reserved recorded / replayed",
        pair(f.recorded_reserved_keys, f.replayed_reserved_keys),
    );
    if let Some(p) = &report.eviction_phase {
        let how = match p.source {
            "estimated" => format!(
                "estimated, {}/{} sessions, {:.3}–{:.3}",
                p.matched, p.sessions, p.plateau_s[0], p.plateau_s[1]
            ),
            other => other.to_string(),
        };
        row(s, "Eviction phase (s)", format!("{:.4} ({how})", p.phase_s));
    }
    let c = &report.completions;
    if c.writes_finished + c.locks_released > 0 {
        row(
            s,
            "Client completions (writes / lock releases)",
            pair(c.writes_finished, c.locks_released),
        );
    }
    for d in &f.first_divergences {
        let what = match d.kind {
            "retrieve" => format!("retrieve {}", d.request_id),
            _ => "store".to_string(),
        };
        s.push_str(&format!(
            "  record {} (byte {}, t={:.3}s) {what}: recorded {}, replayed {}: {}\n",
            d.record, d.offset, d.t_mono, d.recorded, d.replayed, d.reason
        ));
    }
    if f.divergences > f.first_divergences.len() as u64 {
        s.push_str(&format!(
            "  ... and {} more (the first {} are listed here, in the JSON and in the CSV)\n",
            f.divergences - f.first_divergences.len() as u64,
            f.first_divergences.len()
        ));
    }
}
