//! One error type for the library and the CLI: every failure prints as one line naming the
//! file, the byte offset or line, and the field, and maps onto the documented exit codes.

use std::fmt;

/// Exit status for success.
pub const EXIT_OK: i32 = 0;
/// Exit status for bad input data, an I/O failure, or a replay with failed calls.
pub const EXIT_DATA: i32 = 1;
/// Exit status for a command line that cannot mean anything.
pub const EXIT_USAGE: i32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is not what it claims to be.
    Data,
    /// The operating system refused a read or write.
    Io,
    /// The command line or a configuration value is wrong.
    Usage,
}

/// Where in a file an error was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Byte(u64),
    Line(u64),
}

#[derive(Clone, Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub file: Option<String>,
    pub place: Option<Place>,
    pub field: Option<String>,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            file: None,
            place: None,
            field: None,
            message: message.into(),
        }
    }

    /// Bad data at a byte offset, in a named field.
    pub fn data(offset: u64, field: impl Into<String>, message: impl Into<String>) -> Error {
        let mut e = Error::new(ErrorKind::Data, message);
        e.place = Some(Place::Byte(offset));
        e.field = Some(field.into());
        e
    }

    /// Bad data on a (1-based) line of a text input, in a named field.
    pub fn line(line: u64, field: impl Into<String>, message: impl Into<String>) -> Error {
        let mut e = Error::new(ErrorKind::Data, message);
        e.place = Some(Place::Line(line));
        e.field = Some(field.into());
        e
    }

    pub fn io(context: impl Into<String>, err: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, format!("{}: {}", context.into(), err))
    }

    /// Bad data whose message names its own place (a report's file and field path).
    pub fn bad_input(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Data, message)
    }

    pub fn usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, message)
    }

    /// Names the file the error belongs to, unless one is named already.
    pub fn in_file(mut self, file: impl fmt::Display) -> Error {
        if self.file.is_none() {
            self.file = Some(file.to_string());
        }
        self
    }

    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Usage => EXIT_USAGE,
            ErrorKind::Data | ErrorKind::Io => EXIT_DATA,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}: ")?;
        }
        match self.place {
            Some(Place::Byte(b)) => write!(f, "byte {b}: ")?,
            Some(Place::Line(l)) => write!(f, "line {l}: ")?,
            None => {}
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Error {}

/// A JSON error's reason without serde's " at line L column C" suffix, for messages that
/// give the position their own way (or need none: one flag's JSON, where the field name
/// locates the mistake).
pub fn json_reason(e: &serde_json::Error) -> String {
    let message = e.to_string();
    match message.find(" at line ") {
        Some(cut) => message[..cut].to_owned(),
        None => message,
    }
}

/// A number as a message repeats it: plain, or in exponent form where the plain one runs
/// long — from 10^15 up, or below 10^-4 but not 0 — since `1e300` and `1e-300` are each some
/// 300 digits written out: `0.5`, `2000000`, `1e-6`, `1e300`.
pub fn short(v: f64) -> String {
    let magnitude = v.abs();
    if magnitude >= 1e15 || (magnitude > 0.0 && magnitude < 1e-4) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn short_numbers_stay_plain_and_long_ones_take_an_exponent() {
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(2e6), "2000000");
        assert_eq!(short(0.0), "0");
        assert_eq!(short(1e-6), "1e-6");
        assert_eq!(short(-1e300), "-1e300");
        assert_eq!(short(f64::NAN), "NaN");
    }
}
