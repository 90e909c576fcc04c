//! The terminal table: LMCache's "Trace Replay Result" layout (64 columns, label left, value
//! right), followed by the sections LMCache lacks.

use crate::lmct::calls::short_name;

use super::ReplayReport;

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

/// `a / b`, for the requested-versus-hit style rows.
fn pair(a: impl std::fmt::Display, b: impl std::fmt::Display) -> String {
    format!("{a} / {b}")
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Renders the report for a terminal.
pub fn render(report: &ReplayReport) -> String {
    let mut s = rule("Trace Replay Result", '=');
    s.push_str(&rule("Overall", '-'));
    row(&mut s, "Trace level", &report.level);
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
        row(&mut s, "Config differs at", d.differing_paths.join(", "));
    }
    row(&mut s, "Pacing", &report.pacing);
    s.push_str(&rule("Per-Op Latency (ms)", '-'));
    for (q, op) in &report.ops {
        let name = short_name(q);
        row(&mut s, &format!("{name} count"), op.count);
        row(
            &mut s,
            &format!("{name} mean"),
            format!("{:.2}", op.mean_ms),
        );
        row(&mut s, &format!("{name} p50"), format!("{:.2}", op.p50_ms));
        row(&mut s, &format!("{name} p99"), format!("{:.2}", op.p99_ms));
        if op.errors > 0 {
            row(&mut s, &format!("{name} errors"), op.errors);
        }
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
    row(
        &mut s,
        "Hit rate (L1 + L2)",
        format!(
            "{} ({} + {})",
            pct(h.hit_rate),
            pct(h.l1_hit_rate),
            pct(h.l2_hit_rate)
        ),
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
    row(&mut s, "Failed reads of prefetched keys", c.read_failures);
    for t in &report.tiers {
        row(
            &mut s,
            &format!("{} {} written / read", t.name, t.backend),
            pair(mib(t.bytes_written), mib(t.bytes_read)),
        );
        row(
            &mut s,
            &format!("{} resident / peak", t.name),
            pair(mib(t.resident_bytes), mib(t.peak_bytes)),
        );
        row(
            &mut s,
            &format!("{} evictions", t.name),
            format!("{} ({})", t.evictions, mib(t.bytes_evicted)),
        );
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
    }
    s.push_str(&rule("", '='));
    s
}
