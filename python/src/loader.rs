//! `Loader`: the native side of a loader's iterator (`datasetrt.Loader`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datasetrt::load::{BatchMetadata, Loader};
use datasetrt::store::CacheSet;
use datasetrt::Unpoison;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::batch::{PyBatch, Rows, ShardMaps};
use crate::draws::PyDrawPlan;
use crate::error::IntoPyResult;
use crate::runtime::runtime;

/// Yields one [`PyBatch`] per batch.
#[pyclass(frozen, module = "datasetrt._native", name = "Loader")]
pub struct PyLoader {
    pub(crate) inner: Mutex<Loader>,
    pub(crate) caches: CacheSet,
    /// The shards this loader's batches map for Python (memoryviews).
    pub(crate) maps: Arc<ShardMaps>,
    pub(crate) plan: PyDrawPlan,
    /// The snapshots its batches draw from (their metadata).
    pub(crate) metadata: Arc<BatchMetadata>,
    /// Batches handed to Python so far.
    pub(crate) delivered: AtomicU64,
}

#[pymethods]
impl PyLoader {
    /// The state after the batches delivered so far; resume with it.
    /// The draws this loader delivers (a copy of its plan).
    #[getter]
    fn plan(&self) -> PyDrawPlan {
        PyDrawPlan {
            plan: self.plan.plan.clone(),
            snapshot: self.plan.snapshot.clone(),
        }
    }

    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.plan
            .state_after(py, self.delivered.load(Ordering::Relaxed))
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        // Mostly the read-ahead has the batch ready: take it without
        // releasing the GIL or entering the runtime (`try_lock`: a thread
        // waiting in the slow path below holds the lock without the GIL).
        let ready = match self.inner.try_lock() {
            Ok(mut guard) => guard.ready(),
            Err(_) => std::task::Poll::Pending,
        };
        let next = match ready {
            std::task::Poll::Ready(next) => next,
            std::task::Poll::Pending => self.wait_next(py)?,
        };
        let Some(next) = next else { return Ok(None) };
        let loaded = next.py()?;
        self.delivered.fetch_add(1, Ordering::Relaxed);
        // the read-ahead budget is released here: Python holds mapped
        // shards (raw records) and the decoded buffers, not the budget
        Ok(Some(PyBatch {
            batch: loaded.batch.clone(),
            caches: Some(self.caches.clone()),
            maps: self.maps.clone(),
            metadata: Rows::Drawn(self.metadata.clone()),
        }))
    }

    /// The loader's physical plan, as EXPLAIN shows it.
    fn explain(&self) -> String {
        self.inner.lock().unpoisoned().explain()
    }

    /// The plan with its metrics so far (rows, payload bytes, read time).
    fn metrics(&self) -> String {
        self.inner.lock().unpoisoned().metrics()
    }
}

impl PyLoader {
    /// Wait for the next batch without the GIL, checking for Ctrl-C.
    fn wait_next(
        &self,
        py: Python<'_>,
    ) -> PyResult<Option<datasetrt::Result<datasetrt::load::LoadedBatch>>> {
        let rt = runtime()?;
        let next = loop {
            // The loader is locked only without the GIL and released before
            // the GIL is taken back, so another thread calling `metrics()`
            // (with the GIL) waits at most one slice instead of deadlocking.
            let polled = py.detach(|| {
                let mut guard = self.inner.lock().unpoisoned();
                let loader: &mut Loader = &mut guard;
                rt.block_on(async {
                    tokio::time::timeout(Duration::from_millis(50), loader.next()).await
                })
            });
            match polled {
                Ok(next) => break next,
                Err(_elapsed) => py.check_signals()?,
            }
        };
        Ok(next)
    }
}
