//! Quantities as people read them in a terminal.

/// Bytes in the largest binary unit that keeps the figure at 1 or more, two decimals:
/// `512 B`, `1.50 KiB`, `205.38 GiB`. A terminal column of `7264384.00 MiB` tells nobody
/// anything at a glance.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// A share (0..1) as a percentage with one decimal: `0.4762` → `47.6%`.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// `n` of `of` as a fraction; 0 when `of` is 0 (a rate over nothing is reported as none, as
/// LMCache reports `hit_rate` 0.0 when nothing was requested).
pub fn fraction(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 / of as f64
    }
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn each_size_takes_the_largest_unit_it_fills() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(131_072 * 13), "1.62 MiB");
        assert_eq!(bytes(210_304 << 20), "205.38 GiB");
        assert_eq!(bytes(u64::MAX), "16384.00 PiB");
    }
}
