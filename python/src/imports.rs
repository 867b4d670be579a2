//! Native readers behind `datasetrt.sources` (imports of data where it
//! already lives): WebDataset tar shards.

use std::path::PathBuf;
use std::sync::Mutex;

use datasetrt::imports::tar::TarSamples;
use datasetrt::Unpoison;
use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatch;

use crate::error::IntoPyResult;
use crate::runtime::detach;

/// The samples of one tar shard as Arrow record batches (the engine's
/// `imports::tar::TarSamples`): columns `key`, `members` and one per wanted
/// extension. Iterating reads the shard without the GIL.
#[pyclass(frozen, module = "datasetrt._native", name = "TarSamples")]
pub struct PyTarSamples {
    inner: Mutex<TarSamples>,
}

#[pymethods]
impl PyTarSamples {
    #[new]
    fn new(
        path: PathBuf,
        wanted: Vec<String>,
        batch_rows: usize,
        batch_bytes: usize,
    ) -> PyResult<Self> {
        let inner = TarSamples::open(&path, wanted, batch_rows, batch_bytes).py()?;
        Ok(PyTarSamples {
            inner: Mutex::new(inner),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyRecordBatch>> {
        let batch = detach(py, || self.inner.lock().unpoisoned().next_batch())?.py()?;
        Ok(batch.map(PyRecordBatch::new))
    }
}
