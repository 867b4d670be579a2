//! Arrow input from Python: one place that reads an `__arrow_c_stream__`
//! object into record batches.
//!
//! Polars exports an all-null (`Null`) column with a buffer that the Arrow C
//! data interface says it must not have, and arrow-rs refuses the whole
//! stream. The Python wrappers therefore send such columns as all-null
//! Booleans and name them in `nulls`; here they become `Null` columns again.

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use pyo3::prelude::*;
use pyo3_arrow::input::AnyRecordBatch;

use crate::error::{invalid, IntoPyResult};

/// The schema and batches of `data`, with the columns named in `nulls`
/// restored to type `Null`.
pub fn collect(
    data: AnyRecordBatch,
    nulls: &[String],
    what: &str,
) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    let reader = data.into_reader()?;
    let schema = reader.schema();
    // the Python side refuses such names before polars exports them (its
    // export aborts on a NUL); this covers every other Arrow producer
    for field in schema.fields() {
        datasetrt::store::check_name_characters(field.name()).py()?;
    }
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("cannot read the {what}: {e}")))?;
    if nulls.is_empty() {
        return Ok((schema, batches));
    }
    let is_null = |f: &Field| nulls.iter().any(|n| n == f.name());
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match is_null(f) {
            true => Field::new(f.name(), DataType::Null, true),
            false => f.as_ref().clone(),
        })
        .collect();
    let restored = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let batches = batches
        .iter()
        .map(|b| {
            let columns: Vec<ArrayRef> = schema
                .fields()
                .iter()
                .zip(b.columns())
                .map(|(f, c)| match is_null(f) {
                    true => new_null_array(&DataType::Null, c.len()),
                    false => c.clone(),
                })
                .collect();
            RecordBatch::try_new(restored.clone(), columns)
                .map_err(|e| invalid(format!("cannot read the {what}: {e}")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((restored, batches))
}
