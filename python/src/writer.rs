//! `CacheWriter`: the native side of `datasetrt.build`.

use std::path::PathBuf;
use std::sync::Mutex;

use arrow::compute::concat_batches;
use datasetrt::store::{CacheWriter, Codec, WriterOptions};
use datasetrt::Unpoison;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyTuple};
use pyo3_arrow::input::{AnyArray, AnyRecordBatch};

use crate::error::{invalid, IntoPyResult};
use crate::runtime::detach;
use crate::spec::{int, some};

/// Every option a `WriterSpec` takes, in the order `repr` shows them.
const WRITER_OPTIONS: [&str; 4] = ["codec", "level", "shard_bytes", "threads"];

/// How caches are written (the engine's `WriterOptions`: codec, zstd level,
/// shard size, compressor threads), its defaults and checks in one place;
/// `build`, `build_ray` and their worker processes pass one along.
#[pyclass(frozen, module = "datasetrt._native", name = "WriterSpec")]
#[derive(Clone)]
pub struct PyWriterSpec {
    pub options: WriterOptions,
}

impl PyWriterSpec {
    /// Apply keyword `options` (`None` keeps a value) to `base`, then check.
    fn with(mut base: WriterOptions, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
            let key: String = key.extract()?;
            let Some(v) = some(&value) else { continue };
            match key.as_str() {
                "codec" => {
                    let name: String = v
                        .extract()
                        .map_err(|_| invalid(format!("codec must be a str, got {}", repr(v))))?;
                    base.codec = Codec::parse(&name).py()?;
                }
                "level" => {
                    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
                        return Err(invalid(format!("level must be an int, got {}", repr(v))));
                    }
                    base.level = v.extract::<i32>().map_err(|_| {
                        invalid(format!("level {} is outside the levels of zstd", repr(v)))
                    })?;
                }
                "shard_bytes" => base.shard_target_bytes = int(v, "shard_bytes", u64::MAX)?,
                "threads" => base.threads = int(v, "threads", 1 << 16)? as usize,
                other => {
                    return Err(invalid(format!(
                        "unknown writer option {other:?}; the options are {}",
                        WRITER_OPTIONS.join(", ")
                    )))
                }
            }
        }
        base.check().py()?;
        Ok(PyWriterSpec { options: base })
    }

    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = &self.options;
        let d = PyDict::new(py);
        d.set_item("codec", o.codec.name())?;
        d.set_item("level", o.level)?;
        d.set_item("shard_bytes", o.shard_target_bytes)?;
        d.set_item("threads", o.threads)?;
        Ok(d)
    }
}

fn repr(v: &Bound<'_, PyAny>) -> String {
    v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
}

#[pymethods]
impl PyWriterSpec {
    /// Defaults: codec "zstd", level 3, shards of 256 MiB, compressor threads
    /// the cores up to 4. An option given as `None` keeps its default.
    #[new]
    #[pyo3(signature = (**options))]
    fn new(options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::with(WriterOptions::default(), options)
    }

    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        match self.to_py(py)?.get_item(name)? {
            Some(value) => Ok(value.unbind()),
            None => Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "WriterSpec has no option {name:?}"
            ))),
        }
    }

    /// Pickles as its options (a build process or Ray task gets a copy).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let rebuild = py.import("datasetrt._native")?.getattr("_writer_spec")?;
        let options = slf.get().to_py(py)?;
        PyTuple::new(py, [rebuild, PyTuple::new(py, [options])?.into_any()])
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyWriterSpec>().is_ok_and(|o| {
            let (a, b) = (&o.get().options, &self.options);
            (a.codec, a.level, a.shard_target_bytes, a.threads)
                == (b.codec, b.level, b.shard_target_bytes, b.threads)
        })
    }

    fn __repr__(&self) -> String {
        let o = &self.options;
        format!(
            "WriterSpec(codec={:?}, level={}, shard_bytes={}, threads={})",
            o.codec.name(),
            o.level,
            o.shard_target_bytes,
            o.threads
        )
    }
}

/// Rebuild a pickled `WriterSpec` from its options.
#[pyfunction]
pub fn _writer_spec(options: &Bound<'_, PyDict>) -> PyResult<PyWriterSpec> {
    PyWriterSpec::with(WriterOptions::default(), Some(options))
}

#[pyclass(frozen, module = "datasetrt._native", name = "CacheWriter")]
pub struct PyCacheWriter {
    inner: Mutex<Option<CacheWriter>>,
}

impl PyCacheWriter {
    fn take(&self) -> PyResult<CacheWriter> {
        self.inner
            .lock()
            .unpoisoned()
            .take()
            .ok_or_else(|| invalid("this cache writer is already finished or aborted"))
    }
}

#[pymethods]
impl PyCacheWriter {
    /// Write cache `name` under `root` as `spec` says (default: a default
    /// `WriterSpec`).
    #[new]
    #[pyo3(signature = (root, name, spec=None))]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        name: String,
        spec: Option<PyRef<'_, PyWriterSpec>>,
    ) -> PyResult<Self> {
        let options = spec.map_or_else(WriterOptions::default, |s| s.options.clone());
        let writer = detach(py, move || CacheWriter::create(&root, &name, options))?.py()?;
        Ok(PyCacheWriter {
            inner: Mutex::new(Some(writer)),
        })
    }

    /// Queue a list of `bytes` records (copied; compressed on native threads).
    fn add(&self, py: Python<'_>, records: &Bound<'_, PyList>) -> PyResult<()> {
        // one allocation of the records' size (a growing vector copies)
        let size = records
            .iter()
            .map(|item| item.cast::<PyBytes>().map_or(0, |b| b.as_bytes().len()))
            .sum();
        let mut data = Vec::with_capacity(size);
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
            let mut guard = self.inner.lock().unpoisoned();
            match guard.as_mut() {
                Some(writer) => writer.add_chunk(data, ends),
                None => Err(datasetrt::Error::invalid(
                    "this cache writer is already finished or aborted",
                )),
            }
        })?
        .py()
    }

    /// Queue the values of an Arrow column of bytes (an array or a stream of
    /// them: binary, large binary, binary view, fixed-size binary), one
    /// record each, without a Python object per record; returns how many.
    fn add_arrow(&self, py: Python<'_>, column: AnyArray) -> PyResult<u64> {
        let mut added = 0;
        for array in column.into_reader()? {
            let array = array.map_err(|e| invalid(format!("reading the data column: {e}")))?;
            added += detach(py, || {
                let mut guard = self.inner.lock().unpoisoned();
                match guard.as_mut() {
                    Some(writer) => writer.add_binary(array.as_ref()),
                    None => Err(datasetrt::Error::invalid(
                        "this cache writer is already finished or aborted",
                    )),
                }
            })?
            .py()?;
        }
        Ok(added)
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

/// Join the caches `parts` (one source's parts, each written by its own
/// build process) into the one cache `name` under `root`, as the engine's
/// `store::merge_parts` does: shards moved, not copied; the parts removed.
#[pyfunction]
pub fn merge_parts(py: Python<'_>, root: PathBuf, name: &str, parts: Vec<PathBuf>) -> PyResult<()> {
    detach(py, || datasetrt::store::merge_parts(&root, name, &parts))?.py()?;
    Ok(())
}

/// Create and return a temporary directory in `root` named as the engine
/// names its own (`store::fs::temp_sibling` of `root/name`): a process that
/// dies leaves it to the next writer or open of `root`, which removes it.
#[pyfunction]
pub fn temp_dir(root: PathBuf, name: &str) -> PyResult<PathBuf> {
    let dir = datasetrt::store::fs::temp_sibling(&root.join(name));
    std::fs::create_dir_all(&dir).map_err(|e| {
        crate::error::to_py(datasetrt::Error::Io {
            path: dir.clone(),
            source: e,
        })
    })?;
    Ok(dir)
}
