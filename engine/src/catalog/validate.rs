//! Validation of metadata updates. A rejected update changes nothing, and
//! every rejection names the row, the column and the value.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use arrow::compute::{cast, cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};

use super::Snapshot;
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

/// Refuse a column `name` of `schema` that is missing or not an integer.
fn identity_field(schema: &SchemaRef, name: &str) -> Result<()> {
    let field = schema.field_with_name(name).map_err(|_| {
        Error::invalid(format!(
            "metadata update has no {name:?} column: every row needs its identity (cache_id, sample_id); \
             columns given: {:?}",
            schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
        ))
    })?;
    if !is_integer(field.data_type()) {
        return Err(Error::invalid(format!(
            "column {name:?} has type {}, expected an integer type",
            field.data_type()
        )));
    }
    Ok(())
}

/// Identity column `col` (named `name`, in a batch whose first row is
/// `first_row` of the update) as Int64, refused if it has a null or a
/// value Int64 cannot hold.
fn identity_column(col: &ArrayRef, name: &str, first_row: usize) -> Result<ArrayRef> {
    if let Some(row) = first_null(col.as_ref()) {
        return Err(Error::invalid(format!(
            "column {name:?} is null at row {}",
            first_row + row
        )));
    }
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(col, &DataType::Int64, &strict)
        .map_err(|e| Error::invalid(format!("column {name:?}: {e}")))
}

/// Check an update's shape and return it in the types it is stored in:
/// identity columns as Int64, `weight` as Float64 (1.0 when absent, added
/// last), other columns as given, in the caller's batches (arrays already
/// of their type are not copied). The values are checked by [`check_rows`].
pub fn normalize(
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    if rows == 0 {
        return Err(empty());
    }
    let shape = Shape::of(schema)?;
    let mut out = Vec::with_capacity(batches.len());
    let mut first_row = 0;
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        out.push(shape.batch(batch, first_row)?);
        first_row += batch.num_rows();
    }
    Ok((shape.stored, out))
}

/// The error of an update without rows.
pub fn empty() -> Error {
    Error::invalid(
        "empty metadata update: a population needs at least one row (nothing was changed)",
    )
}

/// An update's columns, checked, and the schema they are stored in (see
/// [`normalize`]): what turns each of its batches into stored types, one
/// batch at a time (the workers of a distributed `select` see their rows
/// in batches, never the whole update).
#[derive(Debug, Clone)]
pub struct Shape {
    given: SchemaRef,
    pub stored: SchemaRef,
    has_weight: bool,
}

impl Shape {
    /// Refuse a schema without integer identity columns, with a column
    /// name that cannot be stored or given twice, or a weight that is not
    /// numeric.
    pub fn of(schema: &SchemaRef) -> Result<Shape> {
        let mut seen = std::collections::HashSet::new();
        for field in schema.fields() {
            let name = field.name();
            crate::store::check_column_name(name)?;
            if !seen.insert(name.as_str()) {
                return Err(Error::invalid(format!("column {name:?} appears twice")));
            }
        }
        identity_field(schema, "cache_id")?;
        identity_field(schema, "sample_id")?;
        let has_weight = match schema.field_with_name("weight") {
            Err(_) => false,
            Ok(f) if f.data_type().is_numeric() => true,
            Ok(f) => {
                return Err(Error::invalid(format!(
                    "column \"weight\" has type {}, expected a numeric type",
                    f.data_type()
                )))
            }
        };
        let mut fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "cache_id" | "sample_id" => Field::new(f.name(), DataType::Int64, false),
                "weight" => Field::new("weight", DataType::Float64, false),
                _ => f.as_ref().clone(),
            })
            .collect();
        if !has_weight {
            fields.push(Field::new("weight", DataType::Float64, false));
        }
        Ok(Shape {
            given: schema.clone(),
            stored: Arc::new(Schema::new(fields)),
            has_weight,
        })
    }

    /// `batch` (of the given schema, its first row `first_row` of the
    /// update) in the stored types.
    pub fn batch(&self, batch: &RecordBatch, first_row: usize) -> Result<RecordBatch> {
        let schema = &self.given;
        if batch.num_columns() != schema.fields().len() {
            return Err(Error::invalid(format!(
                "a batch of the update has {} columns, its schema {}",
                batch.num_columns(),
                schema.fields().len()
            )));
        }
        let mut columns = Vec::with_capacity(self.stored.fields().len());
        for (field, col) in schema.fields().iter().zip(batch.columns()) {
            columns.push(match field.name().as_str() {
                name @ ("cache_id" | "sample_id") => identity_column(col, name, first_row)?,
                "weight" => {
                    if let Some(row) = first_null(col.as_ref()) {
                        return Err(Error::invalid(format!(
                            "column \"weight\" is null at row {}",
                            first_row + row
                        ))
                        .at_row(first_row + row)
                        .at_column("weight", None));
                    }
                    cast(col, &DataType::Float64)?
                }
                _ => col.clone(),
            });
        }
        if !self.has_weight {
            columns.push(Arc::new(Float64Array::from(vec![1.0; batch.num_rows()])) as ArrayRef);
        }
        Ok(RecordBatch::try_new(self.stored.clone(), columns)?)
    }
}

/// The caches an update's identities must name, with their bounds: each
/// one's id, name and records (its `sample_id`s are `0..records`), sorted by
/// id. What a worker of a distributed `select` is sent in place of the
/// caches themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheBounds(pub Vec<(i64, String, u64)>);

impl CacheBounds {
    pub fn of(caches: &CacheSet) -> CacheBounds {
        CacheBounds(
            caches
                .iter()
                .map(|c| (c.id(), c.name().to_string(), c.records()))
                .collect(),
        )
    }

    fn position_near(&self, cache_id: i64, hint: usize) -> Option<usize> {
        if self.0.get(hint).is_some_and(|c| c.0 == cache_id) {
            return Some(hint);
        }
        self.0.binary_search_by_key(&cache_id, |c| c.0).ok()
    }

    fn ids(&self) -> Vec<i64> {
        self.0.iter().map(|c| c.0).collect()
    }
}

/// The checks of the partitions of an update derived from `base`: every
/// weight, and the identities, except in a partition whose identity
/// columns are the base's (checked when they were written: a reweight
/// reads only its weights).
pub struct PartitionChecks<'a> {
    checked: std::collections::HashSet<(&'a str, &'a str)>,
    ids: (usize, usize),
    samples: &'a CacheBounds,
}

impl<'a> PartitionChecks<'a> {
    /// For partitions of `schema` (normalized) against `samples`.
    pub fn new(base: &'a Snapshot, schema: &SchemaRef, samples: &'a CacheBounds) -> Result<Self> {
        Ok(PartitionChecks {
            checked: base.identity_hashes(),
            ids: (schema.index_of("cache_id")?, schema.index_of("sample_id")?),
            samples,
        })
    }

    /// Check partition `part` (its first row `first_row` of the update, the
    /// content hashes of its columns `hashes`); the sum of its weights.
    pub fn check(&self, first_row: usize, part: &RecordBatch, hashes: &[String]) -> Result<f64> {
        let ids = (hashes[self.ids.0].as_str(), hashes[self.ids.1].as_str());
        check_rows(self.samples, part, first_row, !self.checked.contains(&ids))
    }
}

/// Check the values of `batch` (normalized, its first row `first_row` of
/// the update): every identity names a stored sample (unless `identities`
/// is false: columns known to be checked already), every weight is finite
/// and non-negative. Returns the sum of its weights.
pub fn check_rows(
    caches: &CacheBounds,
    batch: &RecordBatch,
    first_row: usize,
    identities: bool,
) -> Result<f64> {
    let column = |name: &str| batch.column_by_name(name).expect("normalized");
    let w = column("weight").as_primitive::<Float64Type>().values();
    if identities {
        let ids = column("cache_id").as_primitive::<Int64Type>().values();
        let samples = column("sample_id").as_primitive::<Int64Type>().values();
        let mut pos = 0usize;
        for i in 0..batch.num_rows() {
            let row = first_row + i;
            pos = caches.position_near(ids[i], pos).ok_or_else(|| {
                Error::invalid(format!(
                    "row {row}: cache_id {} is not a cache of this dataset (known cache_ids: {:?})",
                    ids[i],
                    caches.ids()
                ))
                .at_row(row)
                .at_column("cache_id", Some(ids[i].to_string()))
            })?;
            let (id, name, records) = &caches.0[pos];
            if samples[i] < 0 || samples[i] as u64 >= *records {
                return Err(Error::invalid(format!(
                    "row {row}: sample_id {} is not stored in cache {:?} (cache_id {}, sample_ids 0..{})",
                    samples[i], name, id, records
                ))
                .at_row(row)
                .at_column("sample_id", Some(samples[i].to_string())));
            }
        }
    }
    let mut total = 0.0f64;
    for (i, &wi) in w.iter().enumerate() {
        if !wi.is_finite() || wi < 0.0 {
            let row = first_row + i;
            let ids = column("cache_id").as_primitive::<Int64Type>().values();
            let samples = column("sample_id").as_primitive::<Int64Type>().values();
            return Err(Error::invalid(format!(
                "row {row} (cache_id {}, sample_id {}): weight {wi:?} is invalid; weights must be finite and non-negative",
                ids[i], samples[i]
            ))
            .at_row(row)
            .at_column("weight", Some(format!("{wi:?}"))));
        }
        total += wi;
    }
    Ok(total)
}

/// Refuse weights of `rows` rows that sum to `total` unless some is positive.
pub fn check_total(rows: usize, total: f64) -> Result<()> {
    if total <= 0.0 || !total.is_finite() {
        return Err(Error::invalid(format!(
            "the weights of all {rows} rows sum to {total}; at least one weight must be positive \
             (and the sum finite)"
        )));
    }
    Ok(())
}
