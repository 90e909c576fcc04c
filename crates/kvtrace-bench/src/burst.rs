//! BurstGPT request logs (`--use-burst-trace`): CSV rows with `Timestamp`, `Request tokens`
//! and `Response tokens`, replayed at their recorded times (divided by `--trace-speedup`).
//! Row `i` belongs to user `i % users`; a user still busy with its previous request sends
//! the next one late, as a client would. Rows carry no conversation, so every request starts
//! one. A path may name a file, a directory of CSV files, or a glob.

use kvtrace_io::limits::{LineLimit, MAX_LINE_BYTES};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::users::{Phase, QosLevel, Request};
use kvtrace_io::error::{Error, Result};

/// One logged request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BurstRow {
    /// Seconds since the first row.
    pub t_s: f64,
    pub context_tokens: u64,
    pub generation_tokens: u64,
}

/// The CSV files a path names, sorted.
fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let shown = path.display().to_string();
    if path.is_dir() {
        let mut out: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| Error::io("cannot list", e).in_file(&shown))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        out.sort();
        return Ok(out);
    }
    if path.exists() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out: Vec<PathBuf> = glob::glob(&shown)
        .map_err(|e| {
            Error::usage(format!(
                "{shown}: not a BurstGPT file, directory or glob: {e}"
            ))
        })?
        .flatten()
        .collect();
    out.sort();
    Ok(out)
}

/// Reads every row of the files a path names, in time order from 0.
pub fn load(path: &Path) -> Result<Vec<BurstRow>> {
    let paths = files(path)?;
    if paths.is_empty() {
        return Err(Error::usage(format!(
            "{}: no such BurstGPT file, and no CSV file matches it",
            path.display()
        )));
    }
    let mut rows = Vec::new();
    for p in &paths {
        read_file(p, &mut rows)?;
    }
    rows.sort_by(|a: &BurstRow, b| a.t_s.total_cmp(&b.t_s));
    let first = rows.first().map_or(0.0, |r| r.t_s);
    for r in &mut rows {
        r.t_s -= first;
    }
    Ok(rows)
}

fn read_file(path: &Path, rows: &mut Vec<BurstRow>) -> Result<()> {
    let shown = path.display().to_string();
    let file =
        std::fs::File::open(path).map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    let mut reader = csv::Reader::from_reader(LineLimit::new(file, MAX_LINE_BYTES));
    let headers = reader
        .headers()
        .map_err(|e| Error::line(1, "header", e.to_string()).in_file(&shown))?
        .clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| Error::line(1, name, "column missing").in_file(&shown))
    };
    let (t, req, resp) = (
        column("Timestamp")?,
        column("Request tokens")?,
        column("Response tokens")?,
    );
    for (i, record) in reader.records().enumerate() {
        let line = i as u64 + 2;
        let record = record.map_err(|e| Error::line(line, "row", e.to_string()).in_file(&shown))?;
        let field = |c: usize, name: &str| -> Result<f64> {
            let text = record.get(c).unwrap_or("").trim();
            text.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    Error::line(line, name, format!("{text:?} is not a number >= 0"))
                        .in_file(&shown)
                })
        };
        rows.push(BurstRow {
            t_s: field(t, "Timestamp")?,
            context_tokens: (field(req, "Request tokens")? as u64).max(1),
            generation_tokens: (field(resp, "Response tokens")? as u64).max(1),
        });
    }
    Ok(())
}

/// A log and how fast to replay it.
#[derive(Clone, Debug)]
pub struct BurstReplay {
    pub rows: Arc<Vec<BurstRow>>,
    /// Timestamps are divided by this; 0 sends without waiting.
    pub speedup: f64,
}

/// One user's rows of a log, at their times, passed over `cycles` times (0: without end).
pub struct BurstStream {
    rows: Arc<Vec<BurstRow>>,
    user: u32,
    users: u32,
    qos: QosLevel,
    next: usize,
    speedup: f64,
    cycles: u32,
    pass: u32,
    span_s: f64,
    sent: u64,
}

impl BurstStream {
    pub fn new(
        rows: Arc<Vec<BurstRow>>,
        user: u32,
        users: u32,
        qos: QosLevel,
        speedup: f64,
        cycles: u32,
    ) -> BurstStream {
        let span_s = rows.last().map_or(0.0, |r| r.t_s);
        BurstStream {
            rows,
            user,
            users: users.max(1),
            qos,
            next: user as usize,
            speedup,
            cycles,
            pass: 0,
            span_s,
            sent: 0,
        }
    }

    /// The next row as a request, with its send time in seconds from the start.
    pub fn next_request(&mut self) -> Option<Request> {
        if self.next >= self.rows.len() {
            self.pass += 1;
            if self.rows.is_empty() || (self.cycles > 0 && self.pass >= self.cycles) {
                return None;
            }
            self.next = self.user as usize;
            if self.next >= self.rows.len() {
                return None;
            }
        }
        let r = self.rows[self.next];
        self.next += self.users as usize;
        let t = f64::from(self.pass) * self.span_s + r.t_s;
        let at_s = if self.speedup > 0.0 {
            t / self.speedup
        } else {
            0.0
        };
        let conversation = self.sent;
        self.sent += 1;
        Some(Request {
            user: self.user,
            qos: self.qos,
            conversation,
            turn: 1,
            context_tokens: r.context_tokens,
            generation_tokens: r.generation_tokens,
            phase: Phase::of(r.context_tokens),
            think_s: 0.0,
            system_prompt: None,
            at_s: Some(at_s),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_timed_from_the_first_and_shared_out_by_user() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("b.csv");
        std::fs::write(
            &path,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             10,ChatGPT,100,20,120,Conversation log\n\
             12,ChatGPT,300,40,340,Conversation log\n\
             11,GPT-4,200,30,230,API log\n",
        )
        .expect("write");
        let rows = load(&path).expect("load");
        assert_eq!(
            rows.iter().map(|r| r.t_s).collect::<Vec<_>>(),
            [0.0, 1.0, 2.0]
        );
        let rows = Arc::new(rows);
        let mut u0 = BurstStream::new(rows.clone(), 0, 2, QosLevel::Batch, 2.0, 1);
        let a = u0.next_request().expect("row 0");
        let b = u0.next_request().expect("row 2");
        assert_eq!((a.context_tokens, a.at_s), (100, Some(0.0)));
        assert_eq!(
            (b.context_tokens, b.at_s),
            (300, Some(1.0)),
            "2 s / speedup 2"
        );
        assert!(u0.next_request().is_none(), "one cycle");
        let mut looping = BurstStream::new(rows, 1, 2, QosLevel::Batch, 1.0, 0);
        looping.next_request();
        assert_eq!(
            looping.next_request().expect("again").at_s,
            Some(3.0),
            "second pass follows the first"
        );
    }

    #[test]
    fn a_bad_row_names_its_line_and_column() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("b.csv");
        std::fs::write(
            &path,
            "Timestamp,Request tokens,Response tokens\n1,10,5\n2,ten,5\n",
        )
        .expect("write");
        let e = load(&path).expect_err("bad row").to_string();
        assert!(e.contains("line 3: Request tokens: \"ten\""), "{e}");
        let e = load(&dir.path().join("none*.csv"))
            .expect_err("nothing")
            .to_string();
        assert!(e.contains("no CSV file matches"), "{e}");
    }
}
