//! Seeded randomness for SQL. DataFusion's `random()` cannot be seeded, so a
//! SQL dev subset or split would change on every run; these functions are
//! stable hashes instead.
//!
//! `drt_uniform(seed, cache_id, sample_id)` is a number in [0, 1) that
//! depends only on its arguments: `WHERE drt_uniform(7, cache_id, sample_id) < 0.1`
//! is the same 10% subset on every run, in every process.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{create_udf, ColumnarValue, ScalarUDF, Volatility};

use crate::sample::{draw_bits, unit_f64};

/// The value of `drt_uniform` for one row.
pub fn uniform(seed: i64, cache_id: i64, sample_id: i64) -> f64 {
    unit_f64(draw_bits(seed as u64, cache_id as u64, sample_id as u64))
}

/// `drt_uniform(seed BIGINT, cache_id BIGINT, sample_id BIGINT) -> DOUBLE`.
pub fn drt_uniform() -> ScalarUDF {
    create_udf(
        "drt_uniform",
        vec![DataType::Int64, DataType::Int64, DataType::Int64],
        DataType::Float64,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let [seed, cache, sample] = arrays.as_slice() else {
                return Err(DataFusionError::Plan(
                    "drt_uniform takes (seed, cache_id, sample_id)".into(),
                ));
            };
            let (seed, cache, sample) = (
                seed.as_primitive::<Int64Type>(),
                cache.as_primitive::<Int64Type>(),
                sample.as_primitive::<Int64Type>(),
            );
            let out: Float64Array = (0..seed.len())
                .map(|i| {
                    (seed.is_valid(i) && cache.is_valid(i) && sample.is_valid(i))
                        .then(|| uniform(seed.value(i), cache.value(i), sample.value(i)))
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    )
}
