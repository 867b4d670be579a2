//! `DrawPlan` and loader states across the boundary. The arithmetic (blocks,
//! batches per reader, resume positions, padding) and the checks of a state
//! are the engine's (`sample::DrawPlan`, `load::LoaderState`); here they are
//! only converted.

use std::sync::Arc;

use datasetrt::catalog::Snapshot;
use datasetrt::load::{LoaderState, ReaderPlace};
use datasetrt::sample::{DrawPlan, Sampling};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::error::{invalid, IntoPyResult};

/// The `format` key of every loader state.
pub const STATE_FORMAT: &str = "datasetrt-loader-state";

/// The layout of the state dict this build writes and reads.
const STATE_VERSION: u64 = 1;

/// The keys a state must have (`batch_size` is informational).
const STATE_KEYS: [&str; 7] = [
    "epoch",
    "epoch_len",
    "fingerprint",
    "position",
    "sampling",
    "seed",
    "snapshot",
];

/// One reader's draws of one epoch over a pinned snapshot.
#[pyclass(frozen, module = "datasetrt._native", name = "DrawPlan")]
pub struct PyDrawPlan {
    pub plan: DrawPlan,
    pub snapshot: Arc<Snapshot>,
}

#[pymethods]
impl PyDrawPlan {
    #[getter]
    fn seed(&self) -> u64 {
        self.plan.seed
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.plan.epoch
    }

    #[getter]
    fn sampling(&self) -> &'static str {
        self.plan.sampling.name()
    }

    /// Draws per epoch (before padding or dropping for ranks).
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.plan.epoch_len
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.plan.batch_size
    }

    /// The snapshot the draws index.
    #[getter]
    fn version(&self) -> u64 {
        self.snapshot.number()
    }

    /// First block delivered (a resume point).
    #[getter]
    fn start_block(&self) -> u64 {
        self.plan.start_block
    }

    /// Blocks in the epoch, after padding or dropping for ranks.
    #[getter]
    fn blocks(&self) -> u64 {
        self.plan.blocks()
    }

    /// Draws all readers deliver together this epoch (after padding or dropping).
    #[getter]
    fn total_draws(&self) -> u64 {
        self.plan.total_draws()
    }

    /// Batches this reader delivers.
    #[getter]
    fn batches(&self) -> u64 {
        self.plan.batches()
    }

    /// Draw positions `(start, end)` of block `block`.
    fn block_range(&self, block: u64) -> (u64, u64) {
        self.plan.block_range(block)
    }

    /// The loader state once this reader has delivered `batches` batches
    /// and the other readers kept pace.
    pub fn state_after<'py>(&self, py: Python<'py>, batches: u64) -> PyResult<Bound<'py, PyDict>> {
        state_to_py(py, &LoaderState::after(&self.plan, &self.snapshot, batches))
    }

    /// The state inside this reader once it delivered `batches` batches of
    /// its own (what a StatefulDataLoader keeps per worker).
    pub fn reader_state_after<'py>(
        &self,
        py: Python<'py>,
        batches: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        state_to_py(
            py,
            &LoaderState::after_reader(&self.plan, &self.snapshot, batches),
        )
    }
}

/// A state as plain, JSON-serialisable data.
pub fn state_to_py<'py>(py: Python<'py>, state: &LoaderState) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("format", STATE_FORMAT)?;
    d.set_item("version", STATE_VERSION)?;
    d.set_item("seed", state.seed)?;
    d.set_item("epoch", state.epoch)?;
    d.set_item("sampling", state.sampling.name())?;
    d.set_item("epoch_len", state.epoch_len)?;
    d.set_item("batch_size", state.batch_size)?;
    d.set_item("snapshot", state.snapshot)?;
    d.set_item("fingerprint", &state.fingerprint)?;
    d.set_item("position", state.position)?;
    if let Some(place) = &state.reader {
        let r = PyDict::new(py);
        r.set_item("rank", place.rank)?;
        r.set_item("world_size", place.world_size)?;
        r.set_item("worker", place.worker)?;
        r.set_item("num_workers", place.num_workers)?;
        r.set_item("resume_block", place.resume_block)?;
        d.set_item("reader", r)?;
    }
    Ok(d)
}

/// A state from `Loader.state_dict()` (after JSON, too); anything else is an
/// `InvalidInputError` naming what is wrong.
pub fn state_from_py(obj: &Bound<'_, PyAny>) -> PyResult<LoaderState> {
    let refuse = || {
        let shown = obj
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into());
        invalid(format!("resume takes a Loader.state_dict(), not {shown}"))
    };
    let dict = obj.cast::<PyDict>().map_err(|_| refuse())?;
    let format = dict.get_item("format")?;
    if !format.is_some_and(|f| f.extract::<String>().is_ok_and(|f| f == STATE_FORMAT)) {
        return Err(refuse());
    }
    if let Some(version) = dict.get_item("version")? {
        if !version.extract::<u64>().is_ok_and(|v| v == STATE_VERSION) {
            return Err(invalid(format!(
                "the loader state has format version {version}; this build reads version \
                 {STATE_VERSION}"
            )));
        }
    }
    let missing: Vec<&str> = STATE_KEYS
        .into_iter()
        .filter(|k| !dict.contains(k).unwrap_or(false))
        .collect();
    if !missing.is_empty() {
        return Err(invalid(format!("the loader state lacks {missing:?}")));
    }
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        dict.get_item(key)?
            .ok_or_else(|| invalid(format!("the loader state lacks [{key:?}]")))
    };
    let int = |key: &str, high: u64| -> PyResult<u64> {
        let value = item(key)?;
        let bad = || {
            invalid(format!(
                "the state's {key} must be an int in [0, {high}], got {value}"
            ))
        };
        if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
            return Err(bad());
        }
        value
            .extract::<u64>()
            .ok()
            .filter(|&v| v <= high)
            .ok_or_else(bad)
    };
    let sampling: String = item("sampling")?
        .extract()
        .map_err(|_| invalid("the state's sampling must be a string"))?;
    let fingerprint: String = item("fingerprint")?
        .extract()
        .map_err(|_| invalid("the state's fingerprint must be a string"))?;
    let batch_size = match dict.get_item("batch_size")? {
        Some(_) => int("batch_size", u32::MAX as u64)? as usize,
        None => 0,
    };
    let reader = match dict.get_item("reader")? {
        None => None,
        Some(place) => {
            let place = place
                .cast::<PyDict>()
                .map_err(|_| invalid("the state's reader must be a dict"))?;
            let field = |key: &str, high: u64| -> PyResult<u64> {
                place
                    .get_item(key)?
                    .filter(|v| !v.is_instance_of::<PyBool>() && v.is_instance_of::<PyInt>())
                    .and_then(|v| v.extract::<u64>().ok())
                    .filter(|&v| v <= high)
                    .ok_or_else(|| {
                        invalid(format!(
                            "the state's reader needs {key:?}, an int in [0, {high}]"
                        ))
                    })
            };
            let small = u32::MAX as u64;
            Some(ReaderPlace {
                rank: field("rank", small)? as u32,
                world_size: field("world_size", small)? as u32,
                worker: field("worker", small)? as u32,
                num_workers: field("num_workers", small)? as u32,
                resume_block: field("resume_block", u64::MAX)?,
            })
        }
    };
    Ok(LoaderState {
        seed: int("seed", u64::MAX)?,
        epoch: int("epoch", u64::MAX)?,
        sampling: Sampling::parse(&sampling).py()?,
        epoch_len: int("epoch_len", u64::MAX)?,
        batch_size,
        snapshot: int("snapshot", i64::MAX as u64)?,
        fingerprint,
        position: int("position", u64::MAX)?,
        reader,
    })
}
