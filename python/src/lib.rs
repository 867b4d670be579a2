//! `datasetrt._native`: thin PyO3 bindings over the engine. Conversion and
//! GIL handling only; all logic lives in `datasetrt-engine`.
//!
//! Built with the feature `distributed` this crate is
//! `datasetrt_distributed._native` (python/distributed/): the same classes,
//! plus `Worker`, with SQL on workers. It is a module of its own so that
//! the tokio of `datasetrt._native` stays without `parking_lot` (see
//! runtime.rs).

mod arrow_in;
mod batch;
mod dataset;
mod draws;
mod error;
#[cfg(feature = "ffi")]
mod ffi;
mod imports;
mod loader;
mod records;
mod remote;
mod runtime;
mod scores;
mod spec;
#[cfg(feature = "distributed")]
mod worker;
mod writer;

use pyo3::prelude::*;

use crate::error::IntoPyResult;

/// Raise `InvalidInputError` unless `name` can be a source (cache directory) name.
#[pyfunction]
fn check_source_name(name: &str) -> PyResult<()> {
    datasetrt::store::validate_source_name(name).py()
}

/// Raise `InvalidInputError` unless `run` can name a training run (the
/// loader's `run=` and a score log's run: one rule, the engine's).
#[pyfunction]
fn check_run(run: &str) -> PyResult<()> {
    datasetrt::catalog::schedule::check_run(run).py()
}

/// Raise `InvalidInputError` unless `name` can be a metadata column.
#[pyfunction]
fn check_column_name(name: &str) -> PyResult<()> {
    datasetrt::store::check_column_name(name).py()
}

/// Whether `path` is a published cache (the engine's rule: it has a MANIFEST).
#[pyfunction]
fn is_cache_dir(path: std::path::PathBuf) -> bool {
    datasetrt::store::Cache::is_cache_dir(&path)
}

/// `data` decompressed with the engine's codec `codec` ("zstd", "lz4",
/// "none") into exactly `raw_len` bytes, without the GIL: for sources whose
/// files are compressed (MDS shards), so no Python package is needed for it.
/// Data that is not `raw_len` bytes of that codec is `InvalidInputError`.
#[pyfunction]
fn decompress<'py>(
    py: Python<'py>,
    codec: &str,
    data: &[u8],
    raw_len: usize,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let codec = datasetrt::store::Codec::parse(codec).py()?;
    let mut failed = None;
    let out = pyo3::types::PyBytes::new_with(py, raw_len, |buf| {
        failed = py
            .detach(|| datasetrt::store::codec::decode_into(codec, data, buf))
            .err();
        Ok(())
    })?;
    match failed {
        None => Ok(out),
        Some(why) => Err(error::invalid(format!("cannot decompress: {why}"))),
    }
}

/// Build the partitions a first snapshot will link for the cache at
/// `cache_dir`, if it is a group of its own (see the engine's
/// `catalog::prepare_partitions`); whether it is.
#[pyfunction]
#[pyo3(signature = (cache_dir, snapshot_dir=None))]
fn prepare_partitions(
    py: Python<'_>,
    cache_dir: std::path::PathBuf,
    snapshot_dir: Option<std::path::PathBuf>,
) -> PyResult<bool> {
    runtime::detach(py, move || {
        datasetrt::catalog::prepare_partitions(&cache_dir, snapshot_dir.as_deref(), None)
    })?
    .py()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<dataset::PyDataset>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<draws::PyDrawPlan>()?;
    m.add_class::<spec::PyLoaderSpec>()?;
    m.add_class::<batch::PyBatch>()?;
    m.add_class::<writer::PyCacheWriter>()?;
    m.add_class::<writer::PyWriterSpec>()?;
    m.add_class::<imports::PyTarSamples>()?;
    m.add_class::<scores::PyScoreWriter>()?;
    m.add_class::<scores::PyScoreState>()?;
    #[cfg(feature = "ffi")]
    m.add_class::<ffi::PyTableProvider>()?;
    #[cfg(feature = "distributed")]
    m.add_class::<worker::PyWorker>()?;
    m.add("RESERVED_COLUMNS", datasetrt::store::RESERVED_COLUMNS)?;
    m.add("PAYLOAD_COLUMNS", datasetrt::store::PAYLOAD_COLUMNS)?;
    m.add(
        "TYPED_MAGIC",
        pyo3::types::PyBytes::new(m.py(), datasetrt::store::records::MAGIC),
    )?;
    m.add("TYPED_ALIGN", datasetrt::store::records::ALIGN)?;
    m.add_function(wrap_pyfunction!(records::encode_record, m)?)?;
    m.add_function(wrap_pyfunction!(records::parse_record, m)?)?;
    m.add_function(wrap_pyfunction!(check_source_name, m)?)?;
    m.add_function(wrap_pyfunction!(check_run, m)?)?;
    m.add_function(wrap_pyfunction!(check_column_name, m)?)?;
    m.add_function(wrap_pyfunction!(is_cache_dir, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_partitions, m)?)?;
    m.add_function(wrap_pyfunction!(decompress, m)?)?;
    m.add_function(wrap_pyfunction!(spec::_loader_spec, m)?)?;
    m.add_function(wrap_pyfunction!(writer::_writer_spec, m)?)?;
    m.add_function(wrap_pyfunction!(writer::merge_parts, m)?)?;
    m.add_function(wrap_pyfunction!(writer::temp_dir, m)?)?;
    m.add_function(wrap_pyfunction!(scores::read_score_run, m)?)?;
    m.add_function(wrap_pyfunction!(scores::score_segments, m)?)?;
    m.add_function(wrap_pyfunction!(scores::check_score_segment, m)?)?;
    m.add_function(wrap_pyfunction!(remote::staging_root, m)?)?;
    m.add_function(wrap_pyfunction!(remote::publish_staged, m)?)?;
    m.add_function(wrap_pyfunction!(remote::remote_caches, m)?)?;
    m.add_function(wrap_pyfunction!(remote::publish_remote, m)?)?;
    Ok(())
}
