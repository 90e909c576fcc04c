//! Why calls failed and why records were skipped, counted by kind with a bounded number of
//! kinds, so a report stays small whatever the trace or the tier says. Replay, sweep and
//! `aggregate` count and merge through these.

use std::collections::BTreeMap;

/// How many failure kinds, and how many skip reasons, a report counts apart; the rest are
/// counted together under [`OTHER_FAILURES`] or [`OTHER_SKIPS`], so neither a tier that names
/// every key in its errors nor a trace of a million made-up qualnames can grow the report.
pub const MAX_REASON_KINDS: usize = 32;

/// The kind under which failures past [`MAX_REASON_KINDS`] are counted.
pub const OTHER_FAILURES: &str = "other failures";

/// The reason under which skipped records past [`MAX_REASON_KINDS`] are counted.
pub const OTHER_SKIPS: &str = "other reasons";

/// Counts one failure under its kind. (One call adds one: the count of a run's calls cannot
/// reach `u64::MAX`, so the overflow [`add_failures`] reports cannot happen here.)
pub fn count_failure(reasons: &mut BTreeMap<String, u64>, reason: &str) {
    add_failures(reasons, failure_kind(reason), 1);
}

/// Adds `n` failures of `kind`, keeping at most [`MAX_REASON_KINDS`] kinds apart; the new
/// count, or `None` (nothing added) where it would pass `u64::MAX`.
pub fn add_failures(reasons: &mut BTreeMap<String, u64>, kind: String, n: u64) -> Option<u64> {
    add_reason(reasons, kind, n, OTHER_FAILURES)
}

/// The longest reason kept whole; a longer one (a qualname of a hostile trace can be
/// megabytes) is cut there and ends in `…`.
pub const MAX_REASON_BYTES: usize = 512;

/// Adds `n` under `reason`, or under `other` once [`MAX_REASON_KINDS`] reasons are counted
/// apart; the new count, or `None` (nothing added) where it would pass `u64::MAX`.
pub fn add_reason(
    reasons: &mut BTreeMap<String, u64>,
    mut reason: String,
    n: u64,
    other: &str,
) -> Option<u64> {
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    let reason = if reasons.contains_key(&reason) || reasons.len() < MAX_REASON_KINDS {
        reason
    } else {
        other.to_owned()
    };
    let count = reasons.entry(reason).or_default();
    *count = count.checked_add(n)?;
    Some(*count)
}

/// The failure kinds as one line: `3 × why; 1 × why`.
pub fn failure_summary(reasons: &BTreeMap<String, u64>) -> String {
    reasons
        .iter()
        .map(|(reason, n)| format!("{n} × {reason}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The failure's kind: its whole text (which tier, what and why) with what differs from call
/// to call replaced: a count standing alone becomes `N`, a run of 16 or more hex digits (a
/// key, or the file named after one) becomes `KEY`. Addresses such as `127.0.0.1:7000` stay.
pub fn failure_kind(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(512));
    let mut rest = reason;
    while let Some(c) = rest.chars().next() {
        let word = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        if word == 0 {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let (token, tail) = rest.split_at(word);
        let before = out.chars().last();
        let after = tail.chars().next();
        // Part of an address: `10.0.0.1`, `:7000`.
        let glued = matches!(before, Some('.' | ':')) || after == Some('.');
        if token.len() >= 16 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
            // The file tier's fan-out directory, `/ab/` before `ab…` (`/N/` once its digits
            // were replaced), varies with the key too.
            if let Some(parent) = out.strip_suffix('/') {
                if let Some((up, dir)) = parent.rsplit_once('/') {
                    let hex = dir.len() == 2 && dir.bytes().all(|b| b.is_ascii_hexdigit());
                    if hex || dir == "N" {
                        out.truncate(up.len() + 1);
                    }
                }
            }
            out.push_str("KEY");
        } else if token.bytes().all(|b| b.is_ascii_digit()) && !glued {
            out.push('N');
        } else {
            out.push_str(token);
        }
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_kind_keeps_the_tier_and_the_why_and_drops_what_varies_per_call() {
        let cluster = "tier I/O failed: resp-cluster 127.0.0.1:7000,127.0.0.1:7001: SET of 12 object(s): Connection refused (os error 111)";
        assert_eq!(
            failure_kind(cluster),
            "tier I/O failed: resp-cluster 127.0.0.1:7000,127.0.0.1:7001: SET of N object(s): Connection refused (os error N)"
        );
        for fan_out in ["3f", "12"] {
            let file = format!("tier I/O failed: /data/kv/{fan_out}/{fan_out}00aa11223344556677889900aabbcc.kv: No space left on device (os error 28)");
            assert_eq!(
                failure_kind(&file),
                "tier I/O failed: /data/kv/KEY.kv: No space left on device (os error N)"
            );
        }
        let redis = "tier I/O failed: redis GET kv:0000000000000000000000000000002a: timed out";
        assert_eq!(
            failure_kind(redis),
            "tier I/O failed: redis GET kv:KEY: timed out"
        );
        assert_eq!(failure_kind("ünïcode 7: x"), "ünïcode N: x");
    }

    #[test]
    fn failure_kinds_past_the_cap_are_counted_together() {
        let mut reasons = BTreeMap::new();
        for i in 0..MAX_REASON_KINDS + 5 {
            count_failure(&mut reasons, &format!("tier{i}x: refused"));
        }
        count_failure(&mut reasons, "tier0x: refused");
        assert_eq!(reasons.len(), MAX_REASON_KINDS + 1);
        assert_eq!(reasons[OTHER_FAILURES], 5);
        assert_eq!(reasons["tier0x: refused"], 2);
        let mut skips = BTreeMap::new();
        let long = "é".repeat(MAX_REASON_BYTES);
        add_reason(&mut skips, long.clone(), 1, OTHER_SKIPS);
        add_reason(&mut skips, long, 1, OTHER_SKIPS);
        let (kept, n) = skips.iter().next().expect("one");
        assert_eq!((kept.chars().count(), *n), (MAX_REASON_BYTES / 2 + 1, 2));
        assert!(kept.ends_with('…'));
    }
}
