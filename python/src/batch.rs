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

use arrow::array::{Array, AsArray, ByteView, RecordBatch, MAX_INLINE_VIEW_LEN};
use arrow::buffer::Buffer;
use arrow::datatypes::{Int64Type, UInt64Type};
use datasetrt::load::BatchMetadata;
use datasetrt::store::{records, CacheSet};
use datasetrt::Unpoison;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMemoryView, PySlice};
use pyo3_arrow::{PyRecordBatch, PyTable};

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
            let maps = self.maps.lock().unpoisoned();
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
        let mut maps = self.maps.lock().unpoisoned();
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

/// Where a batch's metadata rows come from.
pub enum Rows {
    /// The snapshots the rows were drawn from: a batch a loader made,
    /// gathered when asked.
    Drawn(Arc<BatchMetadata>),
    /// The rows themselves: a batch unpickled in another process, which
    /// has no dataset.
    Carried(RecordBatch),
}

#[pyclass(frozen, module = "datasetrt._native", name = "Batch")]
pub struct PyBatch {
    pub batch: RecordBatch,
    /// The caches the payloads were read from; `None` for a batch
    /// unpickled from Arrow IPC (its payloads are its own bytes).
    pub caches: Option<CacheSet>,
    pub maps: Arc<ShardMaps>,
    pub metadata: Rows,
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

    /// The rows' metadata, gathered without the GIL.
    fn gather_metadata(&self, py: Python<'_>) -> PyResult<RecordBatch> {
        let drawn = match &self.metadata {
            Rows::Drawn(drawn) => drawn,
            Rows::Carried(rows) => return Ok(rows.clone()),
        };
        let column = |k: usize| self.batch.column(k).as_primitive::<UInt64Type>().values();
        let (snapshots, rows) = (column(SNAPSHOT), column(ROW));
        crate::runtime::detach(py, || drawn.rows(snapshots, rows))?.py()
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
        let Some(caches) = &self.caches else {
            return Ok(None);
        };
        let (cache_id, sample_id) = (self.ids(CACHE_ID)[row], self.ids(SAMPLE_ID)[row]);
        let cache = &caches[caches.position(cache_id).py()?];
        let entry = cache.entry(sample_id as u64).py()?;
        let Some((path, len)) = cache.shard_file(entry.shard, buffer) else {
            return Ok(None);
        };
        Ok(self.maps.get(py, path, len)?.map(|m| (m, len)))
    }
}

/// `batch` as the bytes of an Arrow IPC stream.
fn ipc_stream(batch: &RecordBatch) -> datasetrt::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// The one record batch of an Arrow IPC stream (its batches as one).
fn read_ipc_stream(bytes: &[u8]) -> datasetrt::Result<RecordBatch> {
    let bad = |e: arrow::error::ArrowError| {
        datasetrt::Error::invalid(format!("not a pickled batch's Arrow IPC stream: {e}"))
    };
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(bad)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    arrow::compute::concat_batches(&schema, &batches).map_err(bad)
}

/// That `batch` has the loader batch's columns, in order and type (the
/// column accessors rely on them), and `rows` one metadata row per row.
fn check_loader_batch(batch: &RecordBatch, rows: &RecordBatch) -> datasetrt::Result<()> {
    use arrow::datatypes::DataType::{BinaryView, Int64, UInt64};
    let want = [UInt64, UInt64, Int64, Int64, UInt64, BinaryView];
    let schema = batch.schema();
    let got: Vec<&arrow::datatypes::DataType> =
        schema.fields().iter().map(|f| f.data_type()).collect();
    if got != want.iter().collect::<Vec<_>>() || batch.column(DATA).null_count() > 0 {
        return Err(datasetrt::Error::invalid(format!(
            "not a pickled batch: its columns are {got:?}"
        )));
    }
    if rows.num_rows() != batch.num_rows() {
        return Err(datasetrt::Error::invalid(format!(
            "not a pickled batch: {} metadata rows for {} rows",
            rows.num_rows(),
            batch.num_rows()
        )));
    }
    Ok(())
}

/// Whether the first and last of the `len` bytes at `address` can be
/// written: the kernel copies one zero byte from /dev/zero to each (bytes
/// the caller is about to overwrite anyway) and answers EFAULT, not a
/// signal, where the memory is read-only or unmapped.
fn writable(address: usize, len: usize) -> bool {
    static ZERO: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let Some(zero) = ZERO.get_or_init(|| std::fs::File::open("/dev/zero").ok()) else {
        return true; // no /dev/zero to ask: as before the check
    };
    [address, address + len - 1].iter().all(|&at| {
        // SAFETY: read(2) writes at most one byte at `at`, inside the range
        // the caller allocated for this copy; the kernel checks the address.
        unsafe { libc::read(zero.as_raw_fd(), at as *mut libc::c_void, 1) == 1 }
    })
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

    /// The first `n` bytes of row `row`'s payload (fewer if it is
    /// shorter) and its length: a typed record's header, read without a
    /// view of every row.
    fn payload_head<'py>(
        &self,
        py: Python<'py>,
        row: usize,
        n: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, usize)> {
        let data = self.batch.column(DATA).as_binary_view();
        if row >= data.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "row {row} of a batch of {}",
                data.len()
            )));
        }
        let value = data.value(row);
        Ok((PyBytes::new(py, &value[..n.min(value.len())]), value.len()))
    }

    /// The first row (of the first `rows`, else of all) whose payload does
    /// not begin with `header` or is shorter than `end` bytes; `None` when
    /// every such row's does and is (the check of a typed field: rows
    /// alike share row 0's header).
    #[pyo3(signature = (header, end, rows=None))]
    fn first_unlike(&self, header: &[u8], end: usize, rows: Option<usize>) -> Option<usize> {
        let data = self.batch.column(DATA).as_binary_view();
        records::first_unlike(data, header, end, rows.unwrap_or(usize::MAX))
    }

    /// Row `row`'s typed-record layout, its header read whole however long:
    /// (header bytes, fields as (name, dtype code, shape, offset, length));
    /// `None` when the row is not a typed record; `InvalidInputError`
    /// saying what is wrong with a damaged header.
    #[allow(clippy::type_complexity)]
    fn payload_layout<'py>(
        &self,
        py: Python<'py>,
        row: usize,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Vec<crate::records::FieldTuple>)>> {
        let data = self.batch.column(DATA).as_binary_view();
        if row >= data.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "row {row} of a batch of {}",
                data.len()
            )));
        }
        let value = data.value(row);
        let parsed = crate::records::layout_or_none(records::parse(value, value.len() as u64))?;
        Ok(parsed.map(|(header_len, fields)| (PyBytes::new(py, &value[..header_len]), fields)))
    }

    /// When every row is alike ([`Self::first_unlike`] of `header` and
    /// `start + len`), copy bytes `start..start + len` of every row's
    /// payload, row after row, into the `capacity` bytes at `address`: a
    /// numpy array or torch tensor of the batch's field, which the caller
    /// holds alive for this call. Unless `fresh` (memory the caller has just
    /// allocated for this), the kernel is first asked whether the memory is
    /// writable. Returns the first row that is not alike instead, having
    /// written nothing. One call, one pass of checks, then the copy without
    /// the GIL.
    #[pyo3(signature = (header, start, len, address, capacity, fresh = false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "a private Python method's keywords, which records.py passes one by one"
    )]
    fn gather_into(
        &self,
        py: Python<'_>,
        header: &[u8],
        start: usize,
        len: usize,
        address: usize,
        capacity: usize,
        fresh: bool,
    ) -> PyResult<Option<usize>> {
        let data = self.batch.column(DATA).as_binary_view();
        let rows = data.len();
        if address == 0 || len == 0 || len.checked_mul(rows) != Some(capacity) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "gather_into: {capacity} bytes at {address:#x} are not {rows} rows of {len}"
            )));
        }
        if let Some(row) = self.first_unlike(header, start + len, None) {
            return Ok(Some(row));
        }
        if !fresh && !writable(address, capacity) {
            // a tensor over a read-only view of a shard (torch cannot mark
            // one read-only): refused, not a crash
            return Err(crate::error::invalid(
                "out= is not writable memory (a tensor or array over a read-only buffer, \
                 such as torch.from_numpy of batch.tensor's view of a shard?)",
            ));
        }
        crate::runtime::detach(py, || {
            // SAFETY: the caller holds `capacity` writable bytes at `address`
            // alive for this call; every row's range lies in its payload
            // (checked above).
            let out = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, capacity) };
            records::gather(data, start, len, out);
        })?;
        Ok(None)
    }

    /// The rows' payloads as one run through a mapped shard, when they are
    /// equally far apart in one file read in place (records read in order,
    /// stored raw): a memoryview over the whole shard, the offset of row 0's
    /// payload in it, and the distance from one payload to the next. `None`
    /// otherwise (then a field is copied with [`Self::gather_into`]).
    fn run<'py>(&self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyAny>, u64, u64)>> {
        let data = self.batch.column(DATA).as_binary_view();
        let views: Vec<ByteView> = data.views().iter().map(|&v| ByteView::from(v)).collect();
        let Some(first) = views.first() else {
            return Ok(None);
        };
        let stride = views
            .get(1)
            .map_or(0, |v| i64::from(v.offset) - i64::from(first.offset));
        let together = views.iter().enumerate().all(|(i, v)| {
            v.length > MAX_INLINE_VIEW_LEN
                && v.buffer_index == first.buffer_index
                && i64::from(v.offset) == i64::from(first.offset) + stride * i as i64
        });
        if !together || stride < 0 || (views.len() > 1 && stride < i64::from(first.length)) {
            return Ok(None);
        }
        let buffer = &data.data_buffers()[first.buffer_index as usize];
        let Some((file, file_len)) = self.shard_view(py, 0, buffer)? else {
            return Ok(None);
        };
        let last = views.last().expect("non-empty");
        if u64::from(last.offset) + u64::from(last.length) > file_len {
            return Ok(None);
        }
        Ok(Some((file, u64::from(first.offset), stride as u64)))
    }

    /// The rows' metadata (each row of the snapshot it was drawn from), as
    /// one Arrow record batch gathered by the engine without the GIL: no
    /// thread pool is needed, so a DataLoader worker made by fork reads it.
    fn metadata(&self, py: Python<'_>) -> PyResult<PyTable> {
        let rows = self.gather_metadata(py)?;
        PyTable::try_new(vec![rows.clone()], rows.schema())
    }

    /// The batch and its metadata rows as two Arrow IPC streams: what a
    /// pickled batch carries (as polars pickles a DataFrame). Only the
    /// payloads' own bytes are copied, not the shards they view.
    fn to_ipc<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let rows = self.gather_metadata(py)?;
        let batch = &self.batch;
        let (batch, rows) = crate::runtime::detach(py, || -> datasetrt::Result<_> {
            let mut columns = batch.columns().to_vec();
            columns[DATA] = Arc::new(batch.column(DATA).as_binary_view().gc());
            let compact = RecordBatch::try_new(batch.schema(), columns)?;
            Ok((ipc_stream(&compact)?, ipc_stream(&rows)?))
        })?
        .py()?;
        Ok((PyBytes::new(py, &batch), PyBytes::new(py, &rows)))
    }

    /// A batch from the two streams of [`Self::to_ipc`]: a native batch
    /// again, whose payloads are its own bytes (no shard is mapped).
    #[staticmethod]
    fn from_ipc(py: Python<'_>, batch: &[u8], metadata: &[u8]) -> PyResult<PyBatch> {
        let (batch, rows) = crate::runtime::detach(py, || -> datasetrt::Result<_> {
            let (batch, rows) = (read_ipc_stream(batch)?, read_ipc_stream(metadata)?);
            check_loader_batch(&batch, &rows)?;
            Ok((batch, rows))
        })?
        .py()?;
        Ok(PyBatch {
            batch,
            caches: None,
            maps: Arc::default(),
            metadata: Rows::Carried(rows),
        })
    }

    /// The batch as an Arrow record batch (`draw`, `row`, `cache_id`,
    /// `sample_id`, `data`); raw payloads stay views over the mapped shard.
    fn to_arrow(&self) -> PyRecordBatch {
        PyRecordBatch::new(self.batch.clone())
    }
}
