//! `DrawPlan` and loader states across the boundary. The arithmetic (blocks,
//! batches per reader, resume positions, padding) and a state's format and
//! checks are the engine's (`sample::DrawPlan`, `load::state`); here they
//! are only converted.

use std::sync::Arc;

use datasetrt::catalog::Snapshot;
use datasetrt::load::{LoaderState, StateValue};
use datasetrt::sample::DrawPlan;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::error::IntoPyResult;

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

/// A state as plain, JSON-serialisable data (the engine's fields).
pub fn state_to_py<'py>(py: Python<'py>, state: &LoaderState) -> PyResult<Bound<'py, PyDict>> {
    fn value<'py>(py: Python<'py>, v: &StateValue) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            StateValue::Int(i) => i.into_pyobject(py)?.into_any(),
            StateValue::Str(s) => s.into_pyobject(py)?.into_any(),
            StateValue::Map(m) => {
                let d = PyDict::new(py);
                for (k, v) in m {
                    d.set_item(k, value(py, v)?)?;
                }
                d.into_any()
            }
            StateValue::Other(shown) => shown.into_pyobject(py)?.into_any(),
        })
    }
    let d = PyDict::new(py);
    for (key, v) in state.to_fields() {
        d.set_item(key, value(py, &v)?)?;
    }
    Ok(d)
}

/// A Python value as a state value: ints that fit 64 bits (not bools),
/// strings and dicts as such, anything else by its `repr`.
fn state_value(v: &Bound<'_, PyAny>) -> StateValue {
    let shown = || StateValue::Other(v.repr().map_or_else(|_| "?".into(), |r| r.to_string()));
    if v.is_instance_of::<PyBool>() {
        shown()
    } else if v.is_instance_of::<PyInt>() {
        v.extract::<u64>().map_or_else(|_| shown(), StateValue::Int)
    } else if let Ok(s) = v.extract::<String>() {
        StateValue::Str(s)
    } else if let Ok(d) = v.cast::<PyDict>() {
        StateValue::Map(
            d.iter()
                .filter_map(|(k, v)| Some((k.extract::<String>().ok()?, state_value(&v))))
                .collect(),
        )
    } else {
        shown()
    }
}

/// A state from `Loader.state_dict()` (after JSON, too); the engine checks
/// it and says what is wrong.
pub fn state_from_py(obj: &Bound<'_, PyAny>) -> PyResult<LoaderState> {
    let shown = obj.repr().map_or_else(|_| "?".into(), |r| r.to_string());
    let fields = match state_value(obj) {
        StateValue::Map(fields) => fields,
        _ => Default::default(),
    };
    LoaderState::from_fields(&fields, &shown).py()
}
