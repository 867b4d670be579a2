//! The `metadata` table for the `datafusion` Python package, through its FFI
//! table-provider capsule (`__datafusion_table_provider__`).

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::error::invalid;
use crate::runtime::runtime;

/// A table provider exported to another DataFusion through the FFI.
#[pyclass(frozen, module = "datasetrt._native", name = "TableProvider")]
pub struct PyTableProvider {
    pub provider: Arc<dyn TableProvider>,
}

#[pymethods]
impl PyTableProvider {
    /// Called by `datafusion.SessionContext.register_table`: `session` hands
    /// over its logical extension codec.
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec_capsule = session
            .call_method0("__datafusion_logical_extension_codec__")
            .map_err(|e| {
                invalid(format!(
                    "the session offers no logical extension codec: {e}"
                ))
            })?;
        let codec_capsule = codec_capsule.cast_into::<PyCapsule>()?;
        let pointer = codec_capsule.pointer_checked(Some(c"datafusion_logical_extension_codec"))?;
        // SAFETY: a capsule of that name holds an FFI_LogicalExtensionCodec,
        // alive as long as the capsule; we clone it before returning.
        let codec = unsafe { pointer.cast::<FFI_LogicalExtensionCodec>().as_ref() }.clone();
        let rt = runtime()?;
        let provider = FFI_TableProvider::new_with_ffi_codec(
            self.provider.clone(),
            false,
            Some(rt.handle().clone()),
            codec,
        );
        PyCapsule::new_with_value(py, provider, c"datafusion_table_provider")
    }
}
