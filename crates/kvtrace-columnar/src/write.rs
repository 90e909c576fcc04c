//! Record batches into files: Parquet (zstd, dictionaries where values repeat) or the Arrow
//! IPC file format (`.arrow`, what `pyarrow.ipc.open_file` and polars' `read_ipc` read),
//! written under a temporary name and renamed into place when complete.

use std::io::BufWriter;
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{ArrowError, DataType, Schema};
use kvtrace_io::error::{Error, Result};
use kvtrace_io::output::OutputFile;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::trace::{Column, TraceBatches, View};

/// The most bytes of encoded rows a Parquet writer holds before it writes a row group.
const ROW_GROUP_BYTES: usize = 64 << 20;

/// A columnar file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    /// The Arrow IPC file format (Feather v2), uncompressed: read back without decoding.
    Arrow,
}

impl Format {
    /// The format a path's extension names: `.parquet`, or `.arrow` / `.feather` / `.ipc`.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "parquet" => Some(Format::Parquet),
            "arrow" | "feather" | "ipc" => Some(Format::Arrow),
            _ => None,
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
        }
    }
}

/// Parquet's settings for kvtrace's files: zstd at level 1 (the fast end: chunk hashes do not
/// compress at any level); row groups of at most 64 MiB, so a writer holds no more than that
/// of a file of any size; and for binary columns, whose values are hashes, no dictionary
/// (they rarely repeat within a page), no compression and no min/max statistics (a range of
/// hashes prunes nothing).
pub(crate) fn parquet_properties(schema: &Schema) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_created_by(format!("kvtrace {}", env!("CARGO_PKG_VERSION")));
    for field in schema.fields() {
        let path = match field.data_type() {
            DataType::Binary => ColumnPath::from(field.name().as_str()),
            DataType::List(_) => ColumnPath::from(vec![
                field.name().clone(),
                "list".to_owned(),
                "item".to_owned(),
            ]),
            _ => continue,
        };
        props = props
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_statistics_enabled(path.clone(), EnabledStatistics::None)
            .set_column_compression(path, Compression::UNCOMPRESSED);
    }
    props.build()
}

/// A columnar file being written.
pub struct BatchWriter {
    inner: Inner,
    shown: String,
    rows: u64,
}

enum Inner {
    Parquet(ArrowWriter<BufWriter<OutputFile>>),
    Arrow(FileWriter<BufWriter<OutputFile>>),
}

fn arrow_error(e: ArrowError) -> Error {
    Error::io("cannot write", std::io::Error::other(e.to_string()))
}

fn parquet_error(e: ParquetError) -> Error {
    Error::io("cannot write", std::io::Error::other(e.to_string()))
}

impl BatchWriter {
    /// Starts `dest` (never one of the run's inputs) for batches of `schema`.
    pub fn create(dest: &Path, format: Format, schema: Arc<Schema>) -> Result<BatchWriter> {
        let shown = dest.display().to_string();
        let file = BufWriter::with_capacity(1 << 20, OutputFile::create(dest)?);
        let inner = match format {
            Format::Parquet => {
                let props = parquet_properties(&schema);
                Inner::Parquet(
                    ArrowWriter::try_new(file, schema, Some(props))
                        .map_err(|e| parquet_error(e).in_file(&shown))?,
                )
            }
            Format::Arrow => Inner::Arrow(
                FileWriter::try_new(file, &schema).map_err(|e| arrow_error(e).in_file(&shown))?,
            ),
        };
        Ok(BatchWriter {
            inner,
            shown,
            rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        match &mut self.inner {
            Inner::Parquet(w) => w.write(batch).map_err(parquet_error),
            Inner::Arrow(w) => w.write(batch).map_err(arrow_error),
        }
        .map_err(|e| e.in_file(&self.shown))
    }

    /// Writes the footer, flushes the file to disk and renames it into place; returns the
    /// rows written.
    pub fn finish(self) -> Result<u64> {
        let shown = self.shown;
        let file = match self.inner {
            Inner::Parquet(w) => w.into_inner().map_err(parquet_error),
            Inner::Arrow(mut w) => w
                .finish()
                .and_then(|()| w.into_inner())
                .map_err(arrow_error),
        }
        .map_err(|e| e.in_file(&shown))?;
        let io = |e: std::io::Error| Error::io("cannot write", e).in_file(&shown);
        file.into_inner()
            .map_err(|e| io(e.into_error()))?
            .commit()
            .map_err(io)?;
        Ok(self.rows)
    }
}

/// What writing a trace as a columnar file did.
#[derive(Clone, Debug, Default)]
pub struct TraceWritten {
    pub rows: u64,
    pub records: u64,
    pub undecodable: u64,
    /// A signal stopped the read: the file holds the rows before it.
    pub interrupted: bool,
    /// Bytes of an incomplete last frame, left out.
    pub truncated_bytes: Option<u64>,
}

/// Writes `batches` (a trace being read) to `dest` as one columnar file. A bad frame ends the
/// read with its error and leaves no output; an interrupt finishes the file with the rows read
/// so far.
pub fn write_trace(
    mut batches: TraceBatches,
    dest: &Path,
    format: Format,
    progress: &dyn Fn(u64),
) -> Result<TraceWritten> {
    let mut writer = BatchWriter::create(
        dest,
        format,
        arrow_array::RecordBatchReader::schema(&batches),
    )?;
    for batch in batches.by_ref() {
        match batch {
            Ok(batch) => {
                writer.write(&batch)?;
                progress(writer.rows);
            }
            Err(_) => break,
        }
    }
    if let Some(e) = batches.failure() {
        return Err(e.clone());
    }
    let summary = batches.summary().cloned().unwrap_or_default();
    let rows = writer.finish()?;
    Ok(TraceWritten {
        rows,
        records: summary.records,
        undecodable: summary.undecodable,
        interrupted: summary.interrupted,
        truncated_bytes: summary.truncation.map(|t| t.available),
    })
}

/// The columns `names` select in `view`, or the view's default columns.
pub fn columns_of(view: View, names: Option<&[String]>) -> Result<Vec<Column>> {
    match names {
        Some(names) => view.select(names),
        None => Ok(view.default_columns()),
    }
}
