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

/// Memoryviews over whole shard files, made once per dataset: a slice of
/// one keeps its `mmap` (and so the mapping) alive after the loader is gone.
/// At most `MAX_MAPS` are kept (each holds a file descriptor); more are
/// made again when needed.
#[derive(Default)]
pub struct ShardMaps {
    maps: Mutex<HashMap<PathBuf, Option<Py<PyAny>>>>,
}

const MAX_MAPS: usize = 256;

impl ShardMaps {
    /// A memoryview over the shard at `path`, `None` when the file no longer
    /// has the length the engine mapped (replaced or truncated since): its
    /// records are then copied from the engine's mapping instead.
    fn get<'py>(
        &self,
        py: Python<'py>,
        path: &std::path::Path,
        len: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        // the lock is never held across a Python call (mmap() releases the GIL)
        let known = {
            let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
            maps.get(path).map(|m| m.as_ref().map(|m| m.clone_ref(py)))
        };
        if let Some(found) = known {
            return Ok(found.map(|m| m.into_bound(py)));
        }
        let made = match File::open(path) {
            Ok(file) if file.metadata().is_ok_and(|m| m.len() == len) => {
                let mmap = py.import("mmap")?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("access", mmap.getattr("ACCESS_READ")?)?;
                // mmap duplicates the descriptor: the file may close after this
                let m = mmap
                    .getattr("mmap")?
                    .call((file.as_raw_fd(), 0), Some(&kwargs))?;
                Some(PyMemoryView::from(&m)?.into_any())
            }
            _ => None,
        };
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if maps.len() >= MAX_MAPS {
            maps.clear();
        }
        maps.insert(
            path.to_path_buf(),
            made.as_ref().map(|m| m.clone().unbind()),
        );
        Ok(made)
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
                    if let Some((path, shard_len, offset)) = cache.raw_location(&entry) {
                        if let Some(whole) = self.maps.get(py, path, shard_len)? {
                            let (start, end) = (offset as isize, (offset as usize + len) as isize);
                            let slice = whole.get_item(PySlice::new(py, start, end, 1))?;
                            // the engine verified these bytes; the slice must be them
                            if slice.len()? == len {
                                view = Some(slice);
                            }
                        }
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
