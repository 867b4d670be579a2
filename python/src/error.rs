//! Engine errors become the Python exceptions of `datasetrt.exceptions`.
//! The classes live in Python so that they can inherit from both
//! `DatasetRTError` and the matching builtin (`ValueError`, ...).

use datasetrt::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static EXCEPTIONS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module =
        EXCEPTIONS.get_or_try_init(py, || py.import("datasetrt.exceptions").map(|m| m.unbind()))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// Convert an engine error into the matching Python exception, with the
/// culprit as attributes (`path`; `record`, `shard`, `offset` for a corrupt
/// record; `row`, `column`, `value` for invalid input; `base` and `head` for
/// a conflict) so that callers need not parse messages.
pub fn to_py(err: Error) -> PyErr {
    let name = match &err {
        Error::InvalidInput { .. } => "InvalidInputError",
        Error::NotFound { .. } => "CacheNotFoundError",
        Error::Corrupt { .. } => "CorruptCacheError",
        Error::UnsupportedVersion { .. } => "UnsupportedFormatError",
        Error::Io { .. } | Error::Remote { .. } => "StorageError",
        Error::Conflict { .. } => "ConflictError",
        Error::DataFusion(_) => "QueryError",
        Error::Arrow(_) => "ArrowError",
        Error::Internal(_) => "InternalError",
    };
    let message = err.to_string();
    Python::attach(|py| {
        let made = class(py, name).and_then(|ty| {
            let exc = ty.call1((message.clone(),))?;
            let path = match &err {
                Error::NotFound { path, .. }
                | Error::Corrupt { path, .. }
                | Error::UnsupportedVersion { path, .. }
                | Error::Io { path, .. } => Some(path),
                Error::Conflict { dir, .. } => Some(dir),
                _ => None,
            };
            // an object's URL stays a string (a Path would fold its "//")
            match (path, &err) {
                (_, Error::Remote { object, .. }) => exc.setattr("path", object)?,
                (Some(p), _) if datasetrt::store::remote::is_url(&p.to_string_lossy()) => {
                    exc.setattr("path", p.to_string_lossy())?
                }
                (Some(p), _) => exc.setattr("path", p)?,
                (None, _) => {}
            }
            if let Error::Conflict { base, head, .. } = &err {
                exc.setattr("base", base)?;
                exc.setattr("head", head)?;
            }
            if let Error::Corrupt {
                record: Some(at), ..
            } = &err
            {
                exc.setattr("record", at.record)?;
                exc.setattr("shard", at.shard)?;
                exc.setattr("offset", at.offset)?;
            }
            if let Error::InvalidInput { culprit, .. } = &err {
                exc.setattr("row", culprit.row)?;
                exc.setattr("column", culprit.column.as_deref())?;
                exc.setattr("value", culprit.value.as_deref())?;
            }
            Ok(PyErr::from_value(exc))
        });
        made.unwrap_or_else(|e| {
            PyRuntimeError::new_err(format!(
                "{message} (and datasetrt.exceptions failed to load: {e})"
            ))
        })
    })
}

/// `?`-friendly conversion for engine results.
pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for datasetrt::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// An invalid-input error raised from the binding layer itself.
pub fn invalid(message: impl Into<String>) -> PyErr {
    to_py(Error::invalid(message))
}
