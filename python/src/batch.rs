//! `Batch`: one loader batch handed to Python as the Arrow record batch the
//! engine produced (`draw`, `row`, `cache_id`, `sample_id`, `data`), with
//! its columns as Python lists on request and its payloads as `bytes`
//! (copies) or as memoryviews over the mapped shard (no copy).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type};
use datasetrt::store::CacheSet;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMemoryView, PySlice};
use pyo3_arrow::PyRecordBatch;

use crate::error::IntoPyResult;

/// Python `mmap` objects over shard files, opened once per loader: a
/// memoryview slice of one keeps it (and so the mapping) alive.
#[derive(Default)]
pub struct ShardMaps {
    maps: Mutex<HashMap<PathBuf, Py<PyAny>>>,
}

impl ShardMaps {
    fn get<'py>(&self, py: Python<'py>, path: &std::path::Path) -> PyResult<Bound<'py, PyAny>> {
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = maps.get(path) {
            return Ok(m.bind(py).clone());
        }
        let file = File::open(path)
            .map_err(|source| datasetrt::Error::Io {
                path: path.to_path_buf(),
                source,
            })
            .py()?;
        let mmap = py.import("mmap")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("access", mmap.getattr("ACCESS_READ")?)?;
        // mmap duplicates the descriptor: the file may close after this
        let m = mmap
            .getattr("mmap")?
            .call((file.as_raw_fd(), 0), Some(&kwargs))?;
        maps.insert(path.to_path_buf(), m.clone().unbind());
        Ok(m)
    }
}

#[pyclass(frozen, module = "datasetrt._native", name = "Batch")]
pub struct PyBatch {
    pub batch: RecordBatch,
    pub caches: CacheSet,
    pub maps: Arc<ShardMaps>,
}

#[pymethods]
impl PyBatch {
    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    /// Rows of the loader's snapshot, in draw order.
    fn rows(&self) -> Vec<u32> {
        self.batch
            .column(1)
            .as_primitive::<UInt32Type>()
            .values()
            .to_vec()
    }

    fn cache_id(&self) -> Vec<i64> {
        self.batch
            .column(2)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    fn sample_id(&self) -> Vec<i64> {
        self.batch
            .column(3)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    /// The payloads as `bytes` (copies).
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let data = self.batch.column(4).as_binary_view();
        let list = PyList::empty(py);
        for v in data.iter() {
            list.append(PyBytes::new(py, v.unwrap_or_default()))?;
        }
        Ok(list)
    }

    /// The payloads as read-only memoryviews: over the mapped shard for a
    /// record stored raw in a file read in place (no copy), over a copy
    /// otherwise (compressed records, evicting replicas, tiny records).
    fn views<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let data = self.batch.column(4).as_binary_view();
        let cache_ids = self.batch.column(2).as_primitive::<Int64Type>().values();
        let sample_ids = self.batch.column(3).as_primitive::<Int64Type>().values();
        let list = PyList::empty(py);
        let mut hint = 0usize;
        for i in 0..self.batch.num_rows() {
            let len = data.value(i).len();
            let mut view = None;
            if len > 12 {
                if let Some(at) = self.caches.position_near(cache_ids[i], hint) {
                    hint = at;
                    let cache = &self.caches[at];
                    let entry = cache.entry(sample_ids[i] as u64).py()?;
                    if let Some((path, offset)) = cache.raw_location(&entry) {
                        let whole = PyMemoryView::from(&self.maps.get(py, path)?)?;
                        let slice =
                            PySlice::new(py, offset as isize, offset as isize + len as isize, 1);
                        view = Some(whole.get_item(slice)?);
                    }
                }
            }
            let view = match view {
                Some(v) => v,
                None => PyMemoryView::from(&PyBytes::new(py, data.value(i)))?.into_any(),
            };
            list.append(view)?;
        }
        Ok(list)
    }

    /// The batch as an Arrow record batch (`draw`, `row`, `cache_id`,
    /// `sample_id`, `data`); raw payloads stay views over the mapped shard.
    fn to_arrow(&self) -> PyRecordBatch {
        PyRecordBatch::new(self.batch.clone())
    }
}
