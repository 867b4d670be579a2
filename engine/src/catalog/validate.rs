//! Validation of metadata updates. A rejected update changes nothing, and
//! every rejection names the row, the column and the value.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use arrow::compute::{cast, cast_with_options, concat_batches, CastOptions};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};

use crate::store::CacheSet;
use crate::{Error, Result};

fn is_integer(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

fn first_null(col: &dyn Array) -> Option<usize> {
    (col.null_count() > 0).then(|| (0..col.len()).find(|&i| col.is_null(i)))?
}

fn identity_column(batch: &RecordBatch, name: &str) -> Result<ArrayRef> {
    let col = batch.column_by_name(name).ok_or_else(|| {
        Error::invalid(format!(
            "metadata update has no {name:?} column: every row needs its identity (cache_id, sample_id); \
             columns given: {:?}",
            batch.schema().fields().iter().map(|f| f.name()).collect::<Vec<_>>()
        ))
    })?;
    if !is_integer(col.data_type()) {
        return Err(Error::invalid(format!(
            "column {name:?} has type {}, expected an integer type",
            col.data_type()
        )));
    }
    if let Some(row) = first_null(col.as_ref()) {
        return Err(Error::invalid(format!(
            "column {name:?} is null at row {row}"
        )));
    }
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(col, &DataType::Int64, &strict)
        .map_err(|e| Error::invalid(format!("column {name:?}: {e}")))
}

/// Check an update against the dataset's caches and return the batch to
/// store: identity columns as Int64, `weight` as Float64 (1.0 when absent),
/// other columns as given.
pub fn validate_update(
    caches: &CacheSet,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<RecordBatch> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    if rows == 0 {
        return Err(Error::invalid(
            "empty metadata update: a population needs at least one row (nothing was changed)",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for field in schema.fields() {
        let name = field.name();
        crate::store::check_column_name(name)?;
        if !seen.insert(name.as_str()) {
            return Err(Error::invalid(format!("column {name:?} appears twice")));
        }
    }
    let batch = match batches {
        [one] => one.clone(),
        _ => concat_batches(schema, batches)?,
    };
    let cache_ids = identity_column(&batch, "cache_id")?;
    let sample_ids = identity_column(&batch, "sample_id")?;
    let weights: ArrayRef = match batch.column_by_name("weight") {
        None => Arc::new(Float64Array::from(vec![1.0; rows])),
        Some(col) if col.data_type().is_numeric() => {
            if let Some(row) = first_null(col.as_ref()) {
                return Err(Error::invalid(format!(
                    "column \"weight\" is null at row {row}"
                )));
            }
            cast(col, &DataType::Float64)?
        }
        Some(col) => {
            return Err(Error::invalid(format!(
                "column \"weight\" has type {}, expected a numeric type",
                col.data_type()
            )))
        }
    };

    let ids = cache_ids.as_primitive::<Int64Type>().values();
    let samples = sample_ids.as_primitive::<Int64Type>().values();
    let w = weights.as_primitive::<Float64Type>().values();
    let mut pos = 0usize;
    let mut total = 0.0f64;
    for row in 0..rows {
        pos = caches.position_near(ids[row], pos).ok_or_else(|| {
            Error::invalid(format!(
                "row {row}: cache_id {} is not a cache of this dataset (known cache_ids: {:?})",
                ids[row],
                caches.ids()
            ))
            .at_row(row)
            .at_column("cache_id", Some(ids[row].to_string()))
        })?;
        let cache = &caches[pos];
        if samples[row] < 0 || samples[row] as u64 >= cache.records() {
            return Err(Error::invalid(format!(
                "row {row}: sample_id {} is not stored in cache {:?} (cache_id {}, sample_ids 0..{})",
                samples[row],
                cache.name(),
                cache.id(),
                cache.records()
            ))
            .at_row(row)
            .at_column("sample_id", Some(samples[row].to_string())));
        }
        let wi = w[row];
        if !wi.is_finite() || wi < 0.0 {
            return Err(Error::invalid(format!(
                "row {row} (cache_id {}, sample_id {}): weight {wi:?} is invalid; weights must be finite and non-negative",
                ids[row], samples[row]
            ))
            .at_row(row)
            .at_column("weight", Some(format!("{wi:?}"))));
        }
        total += wi;
    }
    if total <= 0.0 || !total.is_finite() {
        return Err(Error::invalid(format!(
            "the weights of all {rows} rows sum to {total}; at least one weight must be positive \
             (and the sum finite)"
        )));
    }

    let mut fields = Vec::with_capacity(batch.num_columns() + 1);
    let mut columns = Vec::with_capacity(batch.num_columns() + 1);
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let replaced = match field.name().as_str() {
            "cache_id" => Some(cache_ids.clone()),
            "sample_id" => Some(sample_ids.clone()),
            "weight" => Some(weights.clone()),
            _ => None,
        };
        match replaced {
            Some(new) => {
                fields.push(Arc::new(Field::new(
                    field.name(),
                    new.data_type().clone(),
                    false,
                )));
                columns.push(new);
            }
            None => {
                fields.push(field.clone());
                columns.push(col.clone());
            }
        }
    }
    if batch.column_by_name("weight").is_none() {
        fields.push(Arc::new(Field::new("weight", DataType::Float64, false)));
        columns.push(weights);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}
