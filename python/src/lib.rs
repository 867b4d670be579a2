//! `datasetrt._native`: thin PyO3 bindings over the engine. Conversion and
//! GIL handling only; all logic lives in `datasetrt-engine`.

mod dataset;
mod error;
mod ffi;
mod runtime;
mod writer;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<dataset::PyDataset>()?;
    m.add_class::<dataset::PyLoader>()?;
    m.add_class::<writer::PyCacheWriter>()?;
    m.add_class::<ffi::PyTableProvider>()?;
    Ok(())
}
