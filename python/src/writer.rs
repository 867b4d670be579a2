//! `CacheWriter`: the native side of `datasetrt.build`.

use std::path::PathBuf;
use std::sync::Mutex;

use arrow::compute::concat_batches;
use datasetrt::store::{CacheWriter, Codec, WriterOptions};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3_arrow::input::AnyRecordBatch;

use crate::error::{invalid, IntoPyResult};
use crate::runtime::detach;

#[pyclass(frozen, module = "datasetrt._native", name = "CacheWriter")]
pub struct PyCacheWriter {
    inner: Mutex<Option<CacheWriter>>,
}

impl PyCacheWriter {
    fn take(&self) -> PyResult<CacheWriter> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| invalid("this cache writer is already finished or aborted"))
    }
}

#[pymethods]
impl PyCacheWriter {
    #[new]
    #[pyo3(signature = (root, name, codec="zstd", level=3, shard_bytes=256 << 20, threads=None))]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        name: String,
        codec: &str,
        level: i32,
        shard_bytes: u64,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut options = WriterOptions {
            codec: Codec::parse(codec).py()?,
            level,
            shard_target_bytes: shard_bytes,
            ..WriterOptions::default()
        };
        if let Some(t) = threads {
            options.threads = t;
        }
        let writer = detach(py, move || CacheWriter::create(&root, &name, options))?.py()?;
        Ok(PyCacheWriter {
            inner: Mutex::new(Some(writer)),
        })
    }

    /// Queue a list of `bytes` records (copied; compressed on native threads).
    fn add(&self, py: Python<'_>, records: &Bound<'_, PyList>) -> PyResult<()> {
        let mut data = Vec::new();
        let mut ends = Vec::with_capacity(records.len());
        for (i, item) in records.iter().enumerate() {
            let bytes = item.cast::<PyBytes>().map_err(|_| {
                invalid(format!(
                    "record {i} of this chunk is {}, expected bytes",
                    item.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            data.extend_from_slice(bytes.as_bytes());
            ends.push(data.len());
        }
        // Locked without the GIL: add_chunk can wait for the compressors, and
        // a thread waiting for the lock must not hold the GIL meanwhile.
        detach(py, || {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_mut() {
                Some(writer) => writer.add_chunk(data, ends),
                None => Err(datasetrt::Error::invalid(
                    "this cache writer is already finished or aborted",
                )),
            }
        })?
        .py()
    }

    /// Publish the cache with `attributes` (one row per record). Returns a dict
    /// describing the published cache.
    #[pyo3(signature = (attributes, nulls=vec![]))]
    fn finish<'py>(
        &self,
        py: Python<'py>,
        attributes: AnyRecordBatch,
        nulls: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (schema, batches) = crate::arrow_in::collect(attributes, &nulls, "attribute stream")?;
        let writer = self.take()?;
        let (manifest, dir) = detach(py, move || -> datasetrt::Result<_> {
            let batch = concat_batches(&schema, &batches)?;
            writer.finish(batch)
        })?
        .py()?;
        let d = PyDict::new(py);
        d.set_item("cache_id", manifest.cache_id)?;
        d.set_item("name", manifest.name)?;
        d.set_item("path", dir)?;
        d.set_item("records", manifest.records)?;
        d.set_item("shards", manifest.shard_bytes.len())?;
        d.set_item("bytes", manifest.shard_bytes.iter().sum::<u64>())?;
        Ok(d)
    }

    /// Drop everything written so far; nothing becomes visible.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        if let Ok(writer) = self.take() {
            detach(py, move || drop(writer))?;
        }
        Ok(())
    }
}
