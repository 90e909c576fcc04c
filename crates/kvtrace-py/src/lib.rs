//! `kvtrace._native`, the compiled half of the `kvtrace` Python package (its Python half,
//! `python/kvtrace/__init__.py`, is the API users call). A trace is handed to Python as an
//! Arrow C stream (the `__arrow_c_stream__` protocol pyarrow, polars and DuckDB import
//! without copying), read on background threads a few batches ahead of the consumer, so a
//! trace larger than memory streams through in bounded memory. Errors are `KvtraceError`s
//! carrying kvtrace's one-line message.

use std::ffi::CStr;
use std::path::PathBuf;

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use kvtrace_columnar::write::columns_of;
use kvtrace_columnar::{TraceBatches, View};
use kvtrace_io::error::Error;
use kvtrace_lmct::ReadOptions;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

create_exception!(
    _native,
    KvtraceError,
    PyException,
    "A kvtrace failure: bad input (naming the file, byte offset and field), an I/O error or a \
     wrong argument."
);

fn raise(e: Error) -> PyErr {
    KvtraceError::new_err(e.to_string())
}

/// The Arrow C stream protocol's capsule name.
const STREAM: &CStr = c"arrow_array_stream";

/// A trace being read as Arrow record batches; export it once with `__arrow_c_stream__`.
#[pyclass(module = "kvtrace._native")]
struct TraceStream {
    batches: Option<TraceBatches>,
}

#[pymethods]
impl TraceStream {
    /// The Arrow C stream of the trace's batches, as a PyCapsule. Stream once.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // kvtrace's schema is fixed by the columns asked for; a requested schema is a hint a
        // producer may ignore.
        let _ = requested_schema;
        let batches = self
            .batches
            .take()
            .ok_or_else(|| KvtraceError::new_err("this trace stream was already read"))?;
        PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(batches)), STREAM)
    }
}

/// Opens `path` for reading as `view` ("records" or "keys") with `columns` (None: the view's
/// default columns) on `threads` decoding threads (0: one per core).
#[pyfunction]
#[pyo3(signature = (path, view = "records", columns = None, threads = 0, max_frame_bytes = None))]
fn open_stream(
    path: PathBuf,
    view: &str,
    columns: Option<Vec<String>>,
    threads: usize,
    max_frame_bytes: Option<u32>,
) -> PyResult<TraceStream> {
    let view = View::parse(view).ok_or_else(|| {
        PyValueError::new_err(format!("view {view:?}: expected \"records\" or \"keys\""))
    })?;
    let columns = columns_of(view, columns.as_deref()).map_err(raise)?;
    let mut read = ReadOptions {
        threads,
        ..ReadOptions::default()
    };
    if let Some(max) = max_frame_bytes {
        read.max_frame_bytes = max;
    }
    let batches = TraceBatches::open(&path, view, &columns, read).map_err(raise)?;
    Ok(TraceStream {
        batches: Some(batches),
    })
}

/// The columns of `view`, in schema order, and which of them are read by default.
#[pyfunction]
fn view_columns(view: &str) -> PyResult<(Vec<&'static str>, Vec<&'static str>)> {
    let view = View::parse(view).ok_or_else(|| {
        PyValueError::new_err(format!("view {view:?}: expected \"records\" or \"keys\""))
    })?;
    Ok((
        view.columns().iter().map(|c| c.name()).collect(),
        view.default_columns().iter().map(|c| c.name()).collect(),
    ))
}

/// `kvtrace info --json`'s figures of one trace, as JSON text.
#[pyfunction]
#[pyo3(signature = (path, threads = 0))]
fn info_json(py: Python<'_>, path: PathBuf, threads: usize) -> PyResult<String> {
    let read = ReadOptions {
        threads,
        ..ReadOptions::default()
    };
    let info = py
        .detach(|| kvtrace_trace::inspect::inspect(&path, read, &|_, _| {}))
        .map_err(raise)?;
    serde_json::to_string(&info).map_err(|e| KvtraceError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("KvtraceError", m.py().get_type::<KvtraceError>())?;
    m.add_class::<TraceStream>()?;
    m.add_function(wrap_pyfunction!(open_stream, m)?)?;
    m.add_function(wrap_pyfunction!(view_columns, m)?)?;
    m.add_function(wrap_pyfunction!(info_json, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
