//! A population reweighted by a score state, natively: what
//! `ScoreLog.reweight` commits. The same weights as the shaped SQL recipes
//! (`reducible_loss_weights`, `loss_ema_weights_shaped`), which call the
//! same rule ([`Shaping`]) through `drt_shape_weights`, without planning a
//! query: the loop's bookkeeping per epoch is this, a fold of the new
//! segments and one commit.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use super::ScoreState;
use crate::catalog::Snapshot;
use crate::sample::{Shape, Shaping};
use crate::{Error, Result};

/// The rows of `snapshot`, each with its `weight` shaped from its score:
/// `ema_loss` in `state`, minus the row's `reference` column when one is
/// named (reducible loss). A row the run has not scored, or whose reference
/// is null, keeps the mean weight, 1. A reference that is NaN or infinite
/// is refused, naming the row. With the `threshold` shape and no
/// reference, the score is measured from the mean `ema_loss` of the scored
/// rows (above the mean: 1), as `loss_ema_weights_shaped` does.
pub fn reweighted(
    snapshot: &Snapshot,
    state: &ScoreState,
    reference: Option<&str>,
    shaping: &Shaping,
) -> Result<Vec<RecordBatch>> {
    let schema = snapshot.schema();
    let weight = schema
        .index_of("weight")
        .map_err(|_| Error::invalid("the population has no weight column"))?;
    let batches = snapshot.batches()?;
    let mut scores = Vec::with_capacity(snapshot.num_rows());
    for batch in batches {
        let ids = |name: &str| -> Result<ArrayRef> {
            Ok(cast(
                batch
                    .column_by_name(name)
                    .expect("every population has ids"),
                &DataType::Int64,
            )?)
        };
        let (cache, sample) = (ids("cache_id")?, ids("sample_id")?);
        let ema = state.ema_of(
            cache.as_primitive::<Int64Type>().values(),
            sample.as_primitive::<Int64Type>().values(),
        );
        match reference {
            None => scores.extend(ema),
            Some(name) => {
                let first = scores.len();
                let column = reference_column(batch, name)?;
                for (i, ema) in ema.into_iter().enumerate() {
                    let r = column.is_valid(i).then(|| column.value(i));
                    scores.push(match r {
                        Some(r) if !r.is_finite() => {
                            return Err(Error::invalid(format!(
                                "reference column {name:?} holds {r} at row {} (null: no score)",
                                first + i
                            ))
                            .at_column(name, Some(r.to_string()))
                            .at_row(first + i))
                        }
                        Some(r) => ema - r,
                        None => f64::NAN,
                    });
                }
            }
        }
    }
    if reference.is_none() && shaping.shape() == Shape::Threshold {
        let scored: Vec<f64> = scores.iter().copied().filter(|s| !s.is_nan()).collect();
        let mean = scored.iter().sum::<f64>() / scored.len().max(1) as f64;
        scores.iter_mut().for_each(|s| *s -= mean);
    }
    let mut weights = shaping.weights(&scores).into_iter();
    batches
        .iter()
        .map(|batch| {
            let mut columns = batch.columns().to_vec();
            let part: Float64Array = weights.by_ref().take(batch.num_rows()).collect();
            columns[weight] = Arc::new(part);
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect()
}

/// Column `name` of `batch` as float64 (any numeric type).
fn reference_column(
    batch: &RecordBatch,
    name: &str,
) -> Result<arrow::array::PrimitiveArray<Float64Type>> {
    let column = batch.column_by_name(name).ok_or_else(|| {
        Error::invalid(format!("the population has no reference column {name:?}"))
            .at_column(name, None)
    })?;
    if !column.data_type().is_numeric() {
        return Err(Error::invalid(format!(
            "reference column {name:?} must be numeric, not {}",
            column.data_type()
        ))
        .at_column(name, None));
    }
    Ok(cast(column, &DataType::Float64)?
        .as_primitive::<Float64Type>()
        .clone())
}
