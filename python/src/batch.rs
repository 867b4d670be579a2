//! `Batch`: one loader batch handed to Python as the Arrow record batch the
//! engine produced (`draw`, `row`, `cache_id`, `sample_id`, `data`), with
//! its columns as Python lists on request and its payloads as `bytes`
//! (copies) or as memoryviews over the mapped shard (no copy).
//!
//! The one piece of state the binding keeps itself (`ShardMaps`): a
//! memoryview must be over a Python object that owns its mapping, so each
//! shard is mapped once more by Python's `mmap` and kept per dataset. Which
//! file, and whether a record lies in it in place, is the engine's answer
//! (`Cache::shard_file`).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, ByteView, RecordBatch, MAX_INLINE_VIEW_LEN};
use arrow::buffer::Buffer;
use arrow::datatypes::{Int64Type, UInt64Type};
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

/// Positions of the loader batch's columns.
const DRAW: usize = 0;
const ROW: usize = 1;
const CACHE_ID: usize = 2;
const SAMPLE_ID: usize = 3;
const SNAPSHOT: usize = 4;
const DATA: usize = 5;

/// A memoryview over a whole shard file and the file's length, or `None`
/// when a buffer's records are copied instead.
type ShardView<'py> = Option<(Bound<'py, PyAny>, u64)>;

impl PyBatch {
    /// The rows' draw positions, cache ids and sample ids.
    pub(crate) fn identities(&self) -> (&[u64], &[i64], &[i64]) {
        let draws = self.batch.column(DRAW).as_primitive::<UInt64Type>();
        (draws.values(), self.ids(CACHE_ID), self.ids(SAMPLE_ID))
    }

    /// The Int64 identity column at `index` (`CACHE_ID` or `SAMPLE_ID`).
    fn ids(&self, index: usize) -> &[i64] {
        self.batch
            .column(index)
            .as_primitive::<Int64Type>()
            .values()
    }

    /// A memoryview over the whole shard file that `buffer` (the buffer of
    /// row `row`'s payload) maps, with the file's length; `None` when the
    /// buffer is not a shard mapped in place or the file has changed.
    fn shard_view<'py>(
        &self,
        py: Python<'py>,
        row: usize,
        buffer: &Buffer,
    ) -> PyResult<ShardView<'py>> {
        let (cache_id, sample_id) = (self.ids(CACHE_ID)[row], self.ids(SAMPLE_ID)[row]);
        let cache = &self.caches[self.caches.position(cache_id).py()?];
        let entry = cache.entry(sample_id as u64).py()?;
        let Some((path, len)) = cache.shard_file(entry.shard, buffer) else {
            return Ok(None);
        };
        Ok(self.maps.get(py, path, len)?.map(|m| (m, len)))
    }
}

#[pymethods]
impl PyBatch {
    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    /// Global draw positions of the rows (draw `k` of the epoch's sequence).
    fn draws(&self) -> Vec<u64> {
        self.batch
            .column(DRAW)
            .as_primitive::<UInt64Type>()
            .values()
            .to_vec()
    }

    /// The snapshot each row was drawn from (the loader's, unless it
    /// follows the head within the epoch).
    fn snapshots(&self) -> Vec<u64> {
        self.batch
            .column(SNAPSHOT)
            .as_primitive::<UInt64Type>()
            .values()
            .to_vec()
    }

    /// Rows of the loader's snapshot, in draw order.
    fn rows(&self) -> Vec<u64> {
        self.batch
            .column(ROW)
            .as_primitive::<UInt64Type>()
            .values()
            .to_vec()
    }

    fn cache_id(&self) -> Vec<i64> {
        self.ids(CACHE_ID).to_vec()
    }

    fn sample_id(&self) -> Vec<i64> {
        self.ids(SAMPLE_ID).to_vec()
    }

    /// The payloads as `bytes` (copies).
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let data = self.batch.column(DATA).as_binary_view();
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
        let data = self.batch.column(DATA).as_binary_view();
        let list = PyList::empty(py);
        // per buffer of the array: the whole shard file as a memoryview, or
        // None when its records are copied; found once, from its first row
        let mut files: Vec<Option<ShardView<'py>>> = vec![None; data.data_buffers().len()];
        for (i, &raw) in data.views().iter().enumerate() {
            let view = ByteView::from(raw);
            let len = view.length as u64;
            let mut whole = None;
            if view.length > MAX_INLINE_VIEW_LEN {
                let b = view.buffer_index as usize;
                if files[b].is_none() {
                    files[b] = Some(self.shard_view(py, i, &data.data_buffers()[b])?);
                }
                whole = files[b].as_ref().and_then(Option::as_ref);
            }
            let item = match whole {
                // the view lies in its buffer, which has the file's length
                Some((file, file_len)) if u64::from(view.offset) + len <= *file_len => {
                    let start = view.offset as isize;
                    file.get_item(PySlice::new(py, start, start + len as isize, 1))?
                }
                _ => PyMemoryView::from(&PyBytes::new(py, data.value(i)))?.into_any(),
            };
            list.append(item)?;
        }
        Ok(list)
    }

    /// The batch as an Arrow record batch (`draw`, `row`, `cache_id`,
    /// `sample_id`, `data`); raw payloads stay views over the mapped shard.
    fn to_arrow(&self) -> PyRecordBatch {
        PyRecordBatch::new(self.batch.clone())
    }
}
