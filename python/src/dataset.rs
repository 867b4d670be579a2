//! `Dataset`: the native side of `datasetrt.Dataset`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use datasetrt::catalog::Snapshot;
use datasetrt::query::QuerySession;
use datasetrt::{load, sample, Dataset, OpenOptions};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::PyTable;

use crate::error::{invalid, IntoPyResult};
use crate::runtime::{detach, wait};

#[pyclass(frozen, module = "datasetrt._native", name = "Dataset")]
pub struct PyDataset {
    inner: Arc<Dataset>,
    query: Arc<QuerySession>,
    /// Serialises population changes so the SQL table follows the catalog.
    writes: Mutex<()>,
}

fn table(snapshot: &Snapshot) -> PyResult<PyTable> {
    PyTable::try_new(vec![snapshot.batch().clone()], snapshot.schema())
}

fn collect(data: AnyRecordBatch) -> PyResult<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
    let reader = data.into_reader()?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("cannot read the Arrow stream: {e}")))?;
    Ok((schema, batches))
}

impl PyDataset {
    fn publish(
        &self,
        py: Python<'_>,
        schema: arrow::datatypes::SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> PyResult<u64> {
        let _guard = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let inner = self.inner.clone();
        let query = self.query.clone();
        detach(py, move || {
            let snapshot = inner.update(&schema, &batches)?;
            query.set_snapshot(&snapshot)?;
            Ok(snapshot.number())
        })?
        .py()
    }
}

#[pymethods]
impl PyDataset {
    #[new]
    #[pyo3(signature = (paths, snapshot_dir=None))]
    fn new(py: Python<'_>, paths: Vec<PathBuf>, snapshot_dir: Option<PathBuf>) -> PyResult<Self> {
        let (inner, query) = detach(py, move || -> datasetrt::Result<_> {
            let ds = Dataset::open(&paths, OpenOptions { snapshot_dir })?;
            let query = QuerySession::new(&ds.snapshot())?;
            Ok((Arc::new(ds), Arc::new(query)))
        })?
        .py()?;
        Ok(PyDataset {
            inner,
            query,
            writes: Mutex::new(()),
        })
    }

    /// One dict per cache: cache_id, name, path, records, codec.
    fn caches<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for c in self.inner.caches() {
            let d = PyDict::new(py);
            d.set_item("cache_id", c.id())?;
            d.set_item("name", c.name())?;
            d.set_item("path", c.dir())?;
            d.set_item("records", c.records())?;
            d.set_item("codec", c.manifest().codec.name())?;
            list.append(d)?;
        }
        Ok(list)
    }

    #[getter]
    fn snapshot(&self) -> u64 {
        self.inner.snapshot().number()
    }

    #[getter]
    fn snapshot_path(&self) -> PathBuf {
        self.inner.snapshot().path().to_path_buf()
    }

    #[getter]
    fn snapshot_dir(&self) -> PathBuf {
        self.inner.snapshot_dir().to_path_buf()
    }

    fn snapshots(&self) -> PyResult<Vec<u64>> {
        self.inner.snapshot_numbers().py()
    }

    fn __len__(&self) -> usize {
        self.inner.snapshot().num_rows()
    }

    /// The active snapshot as an Arrow table over the mapped file (no copy).
    fn metadata(&self) -> PyResult<PyTable> {
        table(&self.inner.snapshot())
    }

    /// Replace the population; returns the new snapshot number.
    fn update(&self, py: Python<'_>, data: AnyRecordBatch) -> PyResult<u64> {
        let (schema, batches) = collect(data)?;
        self.publish(py, schema, batches)
    }

    fn sql(&self, py: Python<'_>, query: String) -> PyResult<PyTable> {
        let session = self.query.clone();
        let (schema, batches) = wait(py, async move { session.sql(&query).await })?.py()?;
        PyTable::try_new(batches, schema)
    }

    /// Set the population to the result of `query`; returns the snapshot number.
    fn select(&self, py: Python<'_>, query: String) -> PyResult<u64> {
        let session = self.query.clone();
        let (schema, batches) = wait(py, async move { session.sql(&query).await })?.py()?;
        self.publish(py, schema, batches)
    }

    fn checkout(&self, py: Python<'_>, number: u64) -> PyResult<u64> {
        let _guard = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let inner = self.inner.clone();
        let query = self.query.clone();
        detach(py, move || {
            let snapshot = inner.checkout(number)?;
            query.set_snapshot(&snapshot)?;
            Ok(snapshot.number())
        })?
        .py()
    }

    /// Payload of one stored sample and its row in the active population
    /// (`None` when the sample is stored but not in the population).
    fn get<'py>(
        &self,
        py: Python<'py>,
        cache_id: i64,
        sample_id: i64,
    ) -> PyResult<(Bound<'py, PyBytes>, Option<usize>)> {
        let inner = self.inner.clone();
        let (bytes, row) = detach(py, move || -> datasetrt::Result<_> {
            let pos = inner.cache_position(cache_id)?;
            let mut out = Vec::new();
            inner.read_into(cache_id, sample_id, &mut out)?;
            let row = inner
                .snapshot()
                .row_of(inner.caches(), pos, sample_id as u64);
            Ok((out, row))
        })?
        .py()?;
        Ok((PyBytes::new(py, &bytes), row))
    }

    /// A reader over draws `start..stop` of `epoch` (weighted, with replacement),
    /// pinned to the active snapshot.
    #[pyo3(signature = (seed, epoch, start, stop, batch_size))]
    fn draws(
        &self,
        seed: u64,
        epoch: u64,
        start: u64,
        stop: u64,
        batch_size: usize,
    ) -> PyResult<PyDrawReader> {
        if batch_size == 0 {
            return Err(invalid("batch_size must be positive"));
        }
        Ok(PyDrawReader {
            dataset: self.inner.clone(),
            snapshot: self.inner.snapshot(),
            seed,
            epoch,
            batch_size,
            position: Mutex::new((start, stop)),
        })
    }
}

/// Yields `(snapshot, rows, cache_ids, sample_ids, payloads)` per batch.
#[pyclass(frozen, module = "datasetrt._native", name = "DrawReader")]
pub struct PyDrawReader {
    dataset: Arc<Dataset>,
    snapshot: Arc<Snapshot>,
    seed: u64,
    epoch: u64,
    batch_size: usize,
    position: Mutex<(u64, u64)>,
}

type DrawBatch<'py> = (u64, Vec<u32>, Vec<i64>, Vec<i64>, Bound<'py, PyList>);

#[pymethods]
impl PyDrawReader {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<DrawBatch<'py>>> {
        let (start, count) = {
            let mut pos = self.position.lock().unwrap_or_else(|p| p.into_inner());
            if pos.0 >= pos.1 {
                return Ok(None);
            }
            let count = (pos.1 - pos.0).min(self.batch_size as u64);
            let start = pos.0;
            pos.0 += count;
            (start, count as usize)
        };
        let dataset = self.dataset.clone();
        let snapshot = self.snapshot.clone();
        let (seed, epoch) = (self.seed, self.epoch);
        let (rows, payloads) = detach(py, move || -> datasetrt::Result<_> {
            let rows = sample::weighted_draws(snapshot.alias_table(), seed, epoch, start, count);
            let payloads = load::read_rows(&dataset, &snapshot, &rows)?;
            Ok((rows, payloads))
        })?
        .py()?;
        let ids = self.snapshot.cache_ids().values();
        let samples = self.snapshot.sample_ids().values();
        let cache_ids = rows.iter().map(|&r| ids[r as usize]).collect();
        let sample_ids = rows.iter().map(|&r| samples[r as usize]).collect();
        let list = PyList::empty(py);
        for i in 0..payloads.len() {
            list.append(PyBytes::new(py, payloads.get(i)))?;
        }
        Ok(Some((
            self.snapshot.number(),
            rows,
            cache_ids,
            sample_ids,
            list,
        )))
    }
}
