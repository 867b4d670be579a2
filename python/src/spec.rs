//! `_native.LoaderSpec`: the engine's `LoaderRequest` (one loader request,
//! its defaults and checks) built from Python keyword arguments. Conversion
//! only: an unknown option or a value of the wrong type is
//! `InvalidInputError` naming it, never a `TypeError` or `OverflowError`.

use datasetrt::load::{LoaderRequest, DEFAULT_PREFETCH_BATCHES};
use datasetrt::sample::Sampling;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyTuple};

use crate::draws::{state_from_py, state_to_py};
use crate::error::{invalid, IntoPyResult};

/// Every option a `LoaderSpec` takes, in the order `repr` shows them.
const OPTIONS: [&str; 17] = [
    "batch_size",
    "seed",
    "epoch",
    "sampling",
    "epoch_len",
    "version",
    "drop_last",
    "rank",
    "world_size",
    "worker",
    "num_workers",
    "start_block",
    "resume",
    "threads",
    "prefetch_bytes",
    "prefetch_batches",
    "run",
];

/// One reader's loader request, frozen: `replace(**options)` makes another.
#[pyclass(frozen, module = "datasetrt._native", name = "LoaderSpec")]
#[derive(Clone)]
pub struct PyLoaderSpec {
    pub request: LoaderRequest,
}

pub(crate) fn int(value: &Bound<'_, PyAny>, name: &str, high: u64) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(invalid(format!(
            "{name} must be an int, got {}",
            value.repr()?
        )));
    }
    match value.extract::<u64>() {
        Ok(v) if v <= high => Ok(v),
        _ => Err(invalid(format!(
            "{name} must be in [0, {high}], got {value}"
        ))),
    }
}

fn small(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    Ok(int(value, name, u32::MAX as u64)? as u32)
}

/// `value` unless it is `None`.
pub(crate) fn some<'a, 'py>(value: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyAny>> {
    (!value.is_none()).then_some(value)
}

/// Option `seed`: an int, or `None`.
fn seed_option(v: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    match some(v) {
        None => Ok(None),
        Some(v) if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() => {
            Err(invalid(format!(
                "seed must be an int (got {}); sampling is never silently random",
                v.repr()?
            )))
        }
        Some(v) => Ok(Some(int(v, "seed", u64::MAX)?)),
    }
}

/// Option `sampling`: the name of a sampling mode.
fn sampling_option(v: &Bound<'_, PyAny>) -> PyResult<Sampling> {
    let name: String = match v.extract() {
        Ok(name) => name,
        // a str UTF-8 cannot hold (a lone surrogate)
        Err(_) if v.is_instance_of::<pyo3::types::PyString>() => {
            return Err(invalid(format!(
                "sampling {} is not valid text: it holds a lone surrogate",
                v.repr()?
            )))
        }
        Err(_) => {
            return Err(invalid(format!(
                "sampling must be a str, got {}",
                v.repr()?
            )))
        }
    };
    Sampling::parse(&name).py()
}

/// Option `run`: a str, or `None`.
fn run_option(v: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    match some(v) {
        None => Ok(None),
        Some(v) => Ok(Some(v.extract::<String>().map_err(|_| {
            invalid(format!(
                "run must be a str or None, not {}",
                v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        })?)),
    }
}

impl PyLoaderSpec {
    /// Apply keyword `options` to `request`, then check the whole request.
    fn with(mut request: LoaderRequest, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let r = &mut request;
        for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
            let key: String = key.extract()?;
            let v = &value;
            match key.as_str() {
                "batch_size" => r.batch_size = int(v, "batch_size", u64::MAX)?,
                "seed" => r.seed = seed_option(v)?,
                "epoch" => r.epoch = int(v, "epoch", u64::MAX)?,
                "sampling" => r.sampling = sampling_option(v)?,
                "epoch_len" => {
                    r.epoch_len = some(v).map(|v| int(v, "epoch_len", u64::MAX)).transpose()?
                }
                "version" => {
                    r.snapshot = some(v)
                        .map(|v| int(v, "snapshot", i64::MAX as u64))
                        .transpose()?
                }
                "drop_last" => r.drop_last = v.is_truthy()?,
                "rank" => r.rank = small(v, "rank")?,
                "world_size" => r.world_size = small(v, "world_size")?,
                "worker" => r.worker = small(v, "worker")?,
                "num_workers" => r.num_workers = small(v, "num_workers")?,
                "start_block" => r.start_block = int(v, "start_block", u64::MAX)?,
                "resume" => r.resume = some(v).map(state_from_py).transpose()?,
                "threads" => {
                    r.threads = some(v).map(|v| int(v, "threads", u64::MAX)).transpose()?
                }
                "prefetch_bytes" => {
                    r.prefetch_bytes = some(v)
                        .map(|v| int(v, "prefetch_bytes", u64::MAX))
                        .transpose()?
                }
                "prefetch_batches" => {
                    r.prefetch_batches = match some(v) {
                        Some(v) => int(v, "prefetch_batches", u64::MAX)?,
                        None => DEFAULT_PREFETCH_BATCHES as u64,
                    }
                }
                "run" => r.run = run_option(v)?,
                other => {
                    return Err(invalid(format!(
                        "unknown loader option {other:?}; the options are {}",
                        OPTIONS.join(", ")
                    )))
                }
            }
        }
        request.validate().py()?;
        Ok(PyLoaderSpec { request })
    }

    /// The options as keyword arguments (what `replace` and pickling start from).
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = &self.request;
        let d = PyDict::new(py);
        d.set_item("batch_size", r.batch_size)?;
        d.set_item("seed", r.seed)?;
        d.set_item("epoch", r.epoch)?;
        d.set_item("sampling", r.sampling.name())?;
        d.set_item("epoch_len", r.epoch_len)?;
        d.set_item("version", r.snapshot)?;
        d.set_item("drop_last", r.drop_last)?;
        d.set_item("rank", r.rank)?;
        d.set_item("world_size", r.world_size)?;
        d.set_item("worker", r.worker)?;
        d.set_item("num_workers", r.num_workers)?;
        d.set_item("start_block", r.start_block)?;
        match &r.resume {
            Some(state) => d.set_item("resume", state_to_py(py, state)?)?,
            None => d.set_item("resume", py.None())?,
        }
        d.set_item("threads", r.threads)?;
        d.set_item("prefetch_bytes", r.prefetch_bytes)?;
        d.set_item("prefetch_batches", r.prefetch_batches)?;
        d.set_item("run", r.run.clone())?;
        Ok(d)
    }
}

#[pymethods]
impl PyLoaderSpec {
    /// Defaults: batch_size 64, epoch 0, sampling "replacement", the
    /// active snapshot, rank 0 of 1, worker 0 of 1, 8 batches read ahead;
    /// threads and prefetch_bytes: the cores and 64 MiB, shared by the
    /// rank's workers. `seed` is required unless `resume` is given.
    #[new]
    #[pyo3(signature = (**options))]
    fn new(options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::with(LoaderRequest::default(), options)
    }

    /// A copy with `options` changed (checked again as a whole).
    #[pyo3(signature = (**options))]
    fn replace(&self, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::with(self.request.clone(), options)
    }

    /// The options as a dict (`LoaderSpec(**spec.to_dict())` is the same spec).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.options(py)
    }

    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        match self.options(py)?.get_item(name)? {
            Some(value) if OPTIONS.contains(&name) => Ok(value.unbind()),
            _ => Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "LoaderSpec has no option {name:?}"
            ))),
        }
    }

    /// Pickles as its options (a spawned DataLoader worker gets a copy).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let rebuild = py.import("datasetrt._native")?.getattr("_loader_spec")?;
        let options = slf.get().options(py)?;
        PyTuple::new(py, [rebuild, PyTuple::new(py, [options])?.into_any()])
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyLoaderSpec>()
            .is_ok_and(|o| o.get().request == self.request)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let options = self.options(py)?;
        let mut parts = Vec::new();
        for name in OPTIONS {
            if let Some(value) = options.get_item(name)? {
                if !value.is_none() {
                    parts.push(format!("{name}={}", value.repr()?));
                }
            }
        }
        Ok(format!("LoaderSpec({})", parts.join(", ")))
    }
}

/// Rebuild a pickled `LoaderSpec` from its options.
#[pyfunction]
pub fn _loader_spec(options: &Bound<'_, PyDict>) -> PyResult<PyLoaderSpec> {
    PyLoaderSpec::with(LoaderRequest::default(), Some(options))
}
