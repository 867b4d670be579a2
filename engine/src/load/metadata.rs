//! The metadata rows of a loader's batches, gathered by the engine.
//!
//! A batch's `metadata` is its rows of the snapshot they were drawn from,
//! taken here with Arrow's gather and handed to Python as one record batch:
//! code in a DataLoader worker forked from a process that ran polars (whose
//! thread pool does not survive fork) reads it with no thread pool at all.
//! A batch cut by a change of the head holds rows of two snapshots; their
//! columns are joined by name (a column one snapshot lacks is null there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::compute::{cast, interleave_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::catalog::{Dataset, Snapshot};
use crate::Unpoison;
use crate::{Error, Result};

/// The snapshots a loader's batches draw from, opened once each.
pub struct BatchMetadata {
    dataset: Arc<Dataset>,
    /// The loader's own snapshot (an empty batch's schema).
    first: u64,
    opened: Mutex<HashMap<u64, Arc<Snapshot>>>,
}

impl BatchMetadata {
    pub fn new(dataset: Arc<Dataset>, snapshot: Arc<Snapshot>) -> Self {
        let first = snapshot.number();
        BatchMetadata {
            dataset,
            first,
            opened: Mutex::new(HashMap::from([(first, snapshot)])),
        }
    }

    fn snapshot(&self, number: u64) -> Result<Arc<Snapshot>> {
        let mut opened = self.opened.lock().unpoisoned();
        if let Some(found) = opened.get(&number) {
            return Ok(found.clone());
        }
        let snapshot = self.dataset.snapshot_at(number)?;
        opened.insert(number, snapshot.clone());
        Ok(snapshot)
    }

    /// Row `rows[i]` of snapshot `snapshots[i]`, for every `i`, in order.
    pub fn rows(&self, snapshots: &[u64], rows: &[u64]) -> Result<RecordBatch> {
        if snapshots.len() != rows.len() {
            return Err(Error::invalid(format!(
                "{} snapshot numbers for {} rows",
                snapshots.len(),
                rows.len()
            )));
        }
        let mut numbers: Vec<u64> = Vec::new();
        for &n in snapshots {
            if !numbers.contains(&n) {
                numbers.push(n);
            }
        }
        match numbers.as_slice() {
            [] => self.snapshot(self.first)?.take(&[]),
            [one] => self.snapshot(*one)?.take(rows),
            _ => self.across(&numbers, snapshots, rows),
        }
    }

    /// Rows of several snapshots: each one's taken, then joined by name.
    fn across(&self, numbers: &[u64], snapshots: &[u64], rows: &[u64]) -> Result<RecordBatch> {
        let mut pieces = Vec::with_capacity(numbers.len());
        let mut indices = Vec::with_capacity(rows.len());
        let mut taken = vec![0usize; numbers.len()];
        for &n in numbers {
            let mine: Vec<u64> = (0..rows.len())
                .filter(|&i| snapshots[i] == n)
                .map(|i| rows[i])
                .collect();
            pieces.push(self.snapshot(n)?.take(&mine)?);
        }
        for &n in snapshots {
            let slot = numbers.iter().position(|&m| m == n).expect("listed");
            indices.push((slot, taken[slot]));
            taken[slot] += 1;
        }
        let schema = joined_schema(&pieces);
        let pieces = pieces
            .iter()
            .map(|piece| conform(piece, &schema))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        Ok(interleave_record_batch(&refs, &indices)?)
    }
}

/// Every column of `pieces` by name, in the order first seen, nullable; a
/// column whose type differs between pieces takes a type both cast to
/// without loss (`Int64` for integers, `Float64` for numbers, else text).
fn joined_schema(pieces: &[RecordBatch]) -> SchemaRef {
    let mut fields: Vec<(String, DataType)> = Vec::new();
    for piece in pieces {
        for field in piece.schema().fields() {
            match fields.iter_mut().find(|(name, _)| name == field.name()) {
                Some((_, known)) => *known = common_type(known, field.data_type()),
                None => fields.push((field.name().clone(), field.data_type().clone())),
            }
        }
    }
    let fields: Vec<Field> = fields
        .into_iter()
        .map(|(name, t)| Field::new(name, t, true))
        .collect();
    Arc::new(Schema::new(fields))
}

fn common_type(a: &DataType, b: &DataType) -> DataType {
    match (a, b) {
        _ if a == b => a.clone(),
        (DataType::Null, other) | (other, DataType::Null) => other.clone(),
        _ if a.is_integer() && b.is_integer() => DataType::Int64,
        _ if a.is_numeric() && b.is_numeric() => DataType::Float64,
        _ => DataType::Utf8,
    }
}

/// `piece` with `schema`'s columns: cast where the type differs, null where
/// the piece lacks the column.
fn conform(piece: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|field| -> Result<ArrayRef> {
            match piece.column_by_name(field.name()) {
                Some(column) if column.data_type() == field.data_type() => Ok(column.clone()),
                Some(column) => Ok(cast(column, field.data_type())?),
                None => Ok(new_null_array(field.data_type(), piece.num_rows())),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray, Float64Array, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{Float64Type, Int64Type};

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn pieces_join_by_name_with_a_lossless_type() {
        let a = batch(vec![
            ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
            ("x", Arc::new(Int64Array::from(vec![10, 20]))),
        ]);
        let b = batch(vec![
            ("x", Arc::new(Float64Array::from(vec![0.5])) as ArrayRef),
            ("id", Arc::new(Int64Array::from(vec![3]))),
            ("note", Arc::new(StringArray::from(vec!["new"]))),
        ]);
        let schema = joined_schema(&[a.clone(), b.clone()]);
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "x", "note"]);
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert_eq!(schema.field(1).data_type(), &DataType::Float64);
        let a = conform(&a, &schema).unwrap();
        let b = conform(&b, &schema).unwrap();
        let x = a.column(1).as_primitive::<Float64Type>();
        assert_eq!(x.values().as_ref(), [10.0, 20.0]);
        assert_eq!(a.column(2).null_count(), 2);
        assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), 3);
        assert_eq!(b.column(2).as_string::<i32>().value(0), "new");
    }

    #[test]
    fn unlike_types_meet_as_text() {
        assert_eq!(
            common_type(&DataType::Utf8, &DataType::Int64),
            DataType::Utf8
        );
        assert_eq!(
            common_type(&DataType::Null, &DataType::Boolean),
            DataType::Boolean
        );
        assert_eq!(
            common_type(&DataType::UInt8, &DataType::Int16),
            DataType::Int64
        );
    }
}
