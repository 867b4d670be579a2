//! `ScoreWriter` and the readers of score logs: the engine's
//! (`datasetrt::catalog::scores`) for `datasetrt.scores.ScoreLog`.
//! Conversion only: a loader batch's own columns, or column buffers; the
//! rows read as an Arrow table.

use std::path::PathBuf;

use std::sync::Mutex;

use datasetrt::catalog::scores::{
    read_run, read_segment, reweighted, segments, Positions, ScoreState, ScoreWriter,
};
use datasetrt::sample::{Shape, Shaping};
use datasetrt::Unpoison;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3_arrow::PyTable;

use crate::batch::PyBatch;
use crate::dataset::PyDataset;
use crate::error::IntoPyResult;
use crate::runtime::detach;

#[pyclass(frozen, module = "datasetrt._native", name = "ScoreWriter")]
pub struct PyScoreWriter {
    inner: ScoreWriter,
}

/// Native-endian 8-byte words of a buffer (`array.array.tobytes()`).
fn words<T>(bytes: &[u8], from: fn([u8; 8]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(8)
        .map(|w| from(w.try_into().expect("8 bytes")))
        .collect()
}

#[pymethods]
impl PyScoreWriter {
    #[new]
    fn new(directory: PathBuf, rank: u32, worker: &str, flush_rows: usize) -> PyResult<Self> {
        Ok(PyScoreWriter {
            inner: ScoreWriter::new(directory, rank, worker, flush_rows).py()?,
        })
    }

    /// Append one row per sample of a loader batch, with its own identities
    /// and draw positions; `values` is a list of numbers (a `TypeError` for
    /// anything else: the caller then takes the checked path).
    fn append_batch(
        &self,
        batch: &Bound<'_, PyBatch>,
        values: &Bound<'_, PyList>,
        epoch: u64,
    ) -> PyResult<()> {
        let values = values
            .iter()
            .map(|v| v.extract::<f64>())
            .collect::<PyResult<Vec<f64>>>()?;
        let (draws, cache_id, sample_id) = batch.get().identities();
        self.inner
            .append(epoch, Positions::Each(draws), cache_id, sample_id, &values)
            .py()
    }

    /// Append one row per sample of a loader batch, with its own identities
    /// and draw positions; `values` the bytes of one native-endian float64
    /// per row (a numpy array's or a CPU tensor's `tobytes()`).
    fn append_batch_values(
        &self,
        batch: &Bound<'_, PyBatch>,
        values: &[u8],
        epoch: u64,
    ) -> PyResult<()> {
        let (draws, cache_id, sample_id) = batch.get().identities();
        if values.len() != 8 * draws.len() {
            return Err(crate::error::invalid(format!(
                "a batch of {} rows needs {} values, got {}",
                draws.len(),
                draws.len(),
                values.len() / 8
            )));
        }
        self.inner
            .append(
                epoch,
                Positions::Each(draws),
                cache_id,
                sample_id,
                &words(values, f64::from_ne_bytes),
            )
            .py()
    }

    /// Append rows given as buffers of native-endian 8-byte words: positions
    /// from `first` on, or one per row in `positions` (uint64); `cache_id`,
    /// `sample_id` (int64) and `values` (float64).
    #[pyo3(signature = (epoch, first, positions, cache_id, sample_id, values))]
    fn append(
        &self,
        epoch: u64,
        first: Option<u64>,
        positions: Option<&[u8]>,
        cache_id: &[u8],
        sample_id: &[u8],
        values: &[u8],
    ) -> PyResult<()> {
        let each = positions.map(|p| words(p, u64::from_ne_bytes));
        let positions = match (&each, first) {
            (Some(p), _) => Positions::Each(p),
            (None, Some(first)) => Positions::From(first),
            (None, None) => Positions::From(0),
        };
        self.inner
            .append(
                epoch,
                positions,
                &words(cache_id, i64::from_ne_bytes),
                &words(sample_id, i64::from_ne_bytes),
                &words(values, f64::from_ne_bytes),
            )
            .py()
    }

    /// Write every appended row (durable on return); the number of rows written.
    fn flush(&self, py: Python<'_>) -> PyResult<usize> {
        detach(py, || self.inner.flush())?.py()
    }

    /// Rows appended and not yet durable.
    #[getter]
    fn pending(&self) -> usize {
        self.inner.pending()
    }
}

/// The per-sample state of one run of a score log, refreshed incrementally
/// (`datasetrt::catalog::scores::ScoreState`).
#[pyclass(frozen, module = "datasetrt._native", name = "ScoreState")]
pub struct PyScoreState {
    inner: Mutex<ScoreState>,
}

#[pymethods]
impl PyScoreState {
    #[new]
    fn new(run_dir: PathBuf, alpha: f64) -> PyResult<Self> {
        Ok(PyScoreState {
            inner: Mutex::new(ScoreState::new(run_dir, alpha).py()?),
        })
    }

    /// Fold the segments published since the last call; the state as an
    /// Arrow table (one row per sample scored).
    fn refresh(&self, py: Python<'_>) -> PyResult<PyTable> {
        let batch = detach(py, || self.inner.lock().unpoisoned().refresh())?.py()?;
        let schema = batch.schema();
        PyTable::try_new(vec![batch], schema)
    }

    /// Fold the segments published since the last call, then commit the
    /// active population of `dataset` with each row's weight shaped from
    /// its `ema_loss` (minus column `reference`, if named); returns the new
    /// snapshot number (`datasetrt::catalog::scores::reweighted`).
    #[pyo3(signature = (dataset, shape, floor, cap, anneal, reference=None, note=String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn reweight(
        &self,
        py: Python<'_>,
        dataset: &PyDataset,
        shape: &str,
        floor: f64,
        cap: f64,
        anneal: f64,
        reference: Option<String>,
        note: String,
    ) -> PyResult<u64> {
        let shaping = shape
            .parse::<Shape>()
            .and_then(|shape| Shaping::new(shape, floor, cap, anneal))
            .py()?;
        dataset.change(py, |live| {
            let mut state = self.inner.lock().unpoisoned();
            state.update()?;
            let snapshot = live.dataset().snapshot();
            let batches = reweighted(&snapshot, &state, reference.as_deref(), &shaping)?;
            live.update(
                &snapshot.schema(),
                &batches,
                &note,
                Some(snapshot.number()),
                false,
            )
        })
    }
}

/// The rows of one run of a score log (its folder), each draw keeping its
/// newest row, in flush order; `None` when the run has no segment.
#[pyfunction]
pub fn read_score_run(py: Python<'_>, run_dir: PathBuf) -> PyResult<Option<PyTable>> {
    let rows = detach(py, move || read_run(&run_dir))?.py()?;
    rows.map(|batch| {
        let schema = batch.schema();
        PyTable::try_new(vec![batch], schema)
    })
    .transpose()
}

/// The published segments of one run's folder, oldest first.
#[pyfunction]
pub fn score_segments(py: Python<'_>, run_dir: PathBuf) -> PyResult<Vec<PathBuf>> {
    detach(py, move || segments(&run_dir))?.py()
}

/// Check one segment file as a reader does (`CorruptCacheError` naming it).
#[pyfunction]
pub fn check_score_segment(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    detach(py, move || read_segment(&path).map(|_| ()))?.py()
}
