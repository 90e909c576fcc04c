//! LMCT writer with LMCache 0.5.6's semantics: the header is written lazily, once — when the
//! storage config is attached, else before the first record, else at close with an empty
//! config and digest — and every frame is one length prefix plus one msgpack body.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::digest::{config_digest, python_json};
use super::frame::{encode_record_head, Header, Record};
use kvtrace_io::error::{Error, Result};
use kvtrace_io::output::OutputFile;

/// Writes one frame: big-endian u32 length, then the body.
pub fn write_frame(out: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(body)
}

/// A zstd encoder of `level` that compresses on worker threads, one a core up to four: on
/// one thread the compression was most of a conversion to `.lct.zst`. zstd's output is the
/// same for any number of workers from one up (not for none), so a file's bytes do not
/// depend on the machine that wrote it. Four workers hold a few tens of MiB of jobs.
pub fn zstd_encoder<W: Write>(out: W, level: i32) -> io::Result<zstd::Encoder<'static, W>> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let mut encoder = zstd::Encoder::new(out, level)?;
    encoder.multithread(workers as u32)?;
    Ok(encoder)
}

/// A trace file on disk, plain or zstd-compressed, written under a temporary name and
/// renamed into place, fsynced, when finished (see [`kvtrace_io::output`]).
pub enum TraceSink {
    Plain(BufWriter<OutputFile>),
    Zstd(zstd::Encoder<'static, BufWriter<OutputFile>>),
}

impl TraceSink {
    /// Starts `path` (what is there stays until [`TraceSink::finish`]); `zstd_level`
    /// selects compression.
    pub fn create(path: &Path, zstd_level: Option<i32>) -> Result<TraceSink> {
        let file = OutputFile::create(path)?;
        let buffered = BufWriter::with_capacity(1 << 20, file);
        Ok(match zstd_level {
            None => TraceSink::Plain(buffered),
            Some(level) => TraceSink::Zstd(
                zstd_encoder(buffered, level).map_err(|e| Error::io("cannot start zstd", e))?,
            ),
        })
    }

    /// Flushes everything, ends the zstd frame, fsyncs the file and renames it into place.
    pub fn finish(self) -> io::Result<()> {
        let buffered = match self {
            TraceSink::Plain(b) => b,
            TraceSink::Zstd(z) => z.finish()?,
        };
        buffered.into_inner().map_err(|e| e.into_error())?.commit()
    }
}

impl Write for TraceSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            TraceSink::Plain(w) => w.write(buf),
            TraceSink::Zstd(w) => w.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            TraceSink::Plain(w) => w.write_all(buf),
            TraceSink::Zstd(w) => w.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            TraceSink::Plain(w) => w.flush(),
            TraceSink::Zstd(w) => w.flush(),
        }
    }
}

/// Writes a trace frame by frame.
pub struct TraceWriter<W: Write> {
    out: W,
    header: Header,
    header_written: bool,
    scratch: Vec<u8>,
    records: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Nothing is written until a config is attached or the first record arrives.
    pub fn new(out: W, header: Header) -> Self {
        TraceWriter {
            out,
            header,
            header_written: false,
            scratch: Vec::with_capacity(4096),
            records: 0,
        }
    }

    /// Sets the config text and its digest and writes the header. Refused once the header
    /// is on disk: LMCT headers are never rewritten in place.
    pub fn attach_storage_config(&mut self, config_json: &str) -> io::Result<()> {
        if self.header_written {
            return Err(io::Error::other(
                "storage config attached after the header was written",
            ));
        }
        self.header.sm_config_json = config_json.to_owned();
        self.header.sm_config_digest = config_digest(config_json);
        self.write_header()
    }

    /// Like [`Self::attach_storage_config`], from a JSON value serialised as Python would.
    pub fn attach_storage_config_value(&mut self, config: &serde_json::Value) -> io::Result<()> {
        self.attach_storage_config(&python_json(config))
    }

    fn write_header(&mut self) -> io::Result<()> {
        if self.header_written {
            return Ok(());
        }
        self.scratch.clear();
        self.header.encode(&mut self.scratch);
        write_frame(&mut self.out, &self.scratch)?;
        self.header_written = true;
        Ok(())
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn write_record(&mut self, record: &Record) -> io::Result<()> {
        self.write_header()?;
        self.scratch.clear();
        record.encode(&mut self.scratch);
        write_frame(&mut self.out, &self.scratch)?;
        self.records += 1;
        Ok(())
    }

    /// Writes a record whose `args` map is already msgpack-encoded.
    pub fn write_record_parts(
        &mut self,
        t_mono: f64,
        t_wall: f64,
        qualname: &str,
        args: &[u8],
    ) -> io::Result<()> {
        self.write_header()?;
        self.scratch.clear();
        encode_record_head(&mut self.scratch, t_mono, t_wall, qualname);
        let len = u32::try_from(self.scratch.len() + args.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
        self.out.write_all(&len.to_be_bytes())?;
        self.out.write_all(&self.scratch)?;
        self.out.write_all(args)?;
        self.records += 1;
        Ok(())
    }

    /// Records written so far (the header not counted).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the header if nothing did yet, flushes, and hands back the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.write_header()?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// zstd's output is the same for any number of workers from one up: what lets
    /// [`zstd_encoder`] take one a core and still write the same bytes on every machine.
    #[test]
    fn compressed_bytes_do_not_depend_on_the_workers() {
        // 24 MB that compresses, but not to nothing: three of level 3's 8 MiB jobs.
        let data: Vec<u8> = (0u32..6_000_000)
            .flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 22).to_le_bytes())
            .collect();
        let compress = |workers| {
            let mut encoder = zstd::Encoder::new(Vec::new(), 3).expect("encoder");
            encoder.multithread(workers).expect("workers");
            encoder.write_all(&data).expect("compress");
            encoder.finish().expect("finish")
        };
        let one = compress(1);
        assert_eq!(compress(3), one);
        assert!(one.len() < data.len() / 2, "{} bytes", one.len());
        assert_eq!(zstd::decode_all(&one[..]).expect("decode"), data);
    }
}
