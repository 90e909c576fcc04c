//! The span tree of one request, independent of any OpenTelemetry crate: what a replay builds,
//! and what an exporter turns into SDK spans.

/// An attribute value, typed as LMCache types it (its hit counts are ints, its rates floats).
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Str(String),
}

/// One span: a name, wall-clock start and end in Unix seconds, and its attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: &'static str,
    pub start_s: f64,
    pub end_s: f64,
    pub attributes: Vec<(&'static str, Attr)>,
}

impl Span {
    pub fn new(name: &'static str, start_s: f64, end_s: f64) -> Span {
        Span {
            name,
            start_s,
            end_s: end_s.max(start_s),
            attributes: Vec::new(),
        }
    }

    pub fn with(mut self, key: &'static str, value: Attr) -> Span {
        self.attributes.push((key, value));
        self
    }
}

/// A root span `request` and its children (`mp.lookup_prefetch`, `mp.retrieve`, `mp.store`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpan {
    pub root: Span,
    pub children: Vec<Span>,
}

impl RequestSpan {
    /// Adds a child, stretching the root to cover it (LMCache closes the root after its last
    /// transfer, so no child sticks out past it).
    pub fn push(&mut self, child: Span) {
        self.root.start_s = self.root.start_s.min(child.start_s);
        self.root.end_s = self.root.end_s.max(child.end_s);
        self.children.push(child);
    }

    /// Spans in the tree, the root included.
    pub fn span_count(&self) -> u64 {
        1 + self.children.len() as u64
    }
}
