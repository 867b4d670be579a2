//! Seeded randomness for SQL. DataFusion's `random()` cannot be seeded, so a
//! SQL dev subset or split would change on every run; these functions are
//! stable hashes instead.
//!
//! `drt_uniform(seed, cache_id, sample_id)` is a number in [0, 1) that
//! depends only on its arguments: `WHERE drt_uniform(7, cache_id, sample_id) < 0.1`
//! is the same 10% subset on every run, in every process.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::function::{PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::type_coercion::functions::fields_with_udf;
use datafusion::logical_expr::{
    create_udf, Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, GroupsAccumulator,
    PartitionEvaluator, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    SimpleScalarUDF, Volatility, WindowUDF, WindowUDFImpl,
};
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::PhysicalExpr;

use crate::sample::{draw_bits, unit_f64, Shape, Shaping};
use crate::Error;

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

/// `drt_shape_weights(score, shape, floor, cap, anneal) OVER (...)`: each
/// row's weight from its score, shaped over the window's partition by the
/// one rule of [`crate::sample::Shaping`] (`ScoreLog.reweight` uses it too).
/// `score` DOUBLE (NULL: no score, weight 1; NaN and infinities are
/// refused), the others literals: `shape` 'linear', 'rank' or 'threshold',
/// `floor` and `anneal` in [0, 1], `cap` >= 1. A bad literal is an
/// `InvalidInputError` naming it, raised when the query is planned.
pub fn drt_shape_weights() -> WindowUDF {
    WindowUDF::from(ShapeWeights {
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ShapeWeights {
    signature: Signature,
}

/// The literal argument `index` of a window function call, by name.
fn literal<'a>(
    args: &'a [Arc<dyn PhysicalExpr>],
    index: usize,
    name: &str,
) -> Result<&'a ScalarValue> {
    args.get(index)
        .and_then(|e| e.downcast_ref::<Literal>())
        .map(Literal::value)
        .ok_or_else(|| {
            Error::invalid(format!("drt_shape_weights takes {name} as a literal")).into()
        })
}

fn literal_f64(args: &[Arc<dyn PhysicalExpr>], index: usize, name: &str) -> Result<f64> {
    match literal(args, index, name)?.cast_to(&DataType::Float64)? {
        ScalarValue::Float64(Some(v)) => Ok(v),
        _ => Err(
            Error::invalid(format!("drt_shape_weights: {name} must not be NULL"))
                .at_column(name, None)
                .into(),
        ),
    }
}

impl WindowUDFImpl for ShapeWeights {
    fn name(&self) -> &str {
        "drt_shape_weights"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 5 {
            return Err(Error::invalid(format!(
                "drt_shape_weights takes (score, shape, floor, cap, anneal), not {} arguments",
                arg_types.len()
            ))
            .into());
        }
        let f = DataType::Float64;
        Ok(vec![f.clone(), DataType::Utf8, f.clone(), f.clone(), f])
    }

    fn partition_evaluator(
        &self,
        args: PartitionEvaluatorArgs,
    ) -> Result<Box<dyn PartitionEvaluator>> {
        let exprs = args.input_exprs();
        let shape = match literal(exprs, 1, "shape")? {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => s.parse::<Shape>()?,
            other => {
                return Err(Error::invalid(format!(
                    "shape must be 'linear', 'rank' or 'threshold', not {other}"
                ))
                .at_column("shape", None)
                .into())
            }
        };
        let (floor, cap, anneal) = (
            literal_f64(exprs, 2, "floor")?,
            literal_f64(exprs, 3, "cap")?,
            literal_f64(exprs, 4, "anneal")?,
        );
        Ok(Box::new(ShapeEvaluator(Shaping::new(
            shape, floor, cap, anneal,
        )?)))
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(
            field_args.name(),
            DataType::Float64,
            false,
        )))
    }
}

#[derive(Debug)]
struct ShapeEvaluator(Shaping);

impl PartitionEvaluator for ShapeEvaluator {
    fn evaluate_all(&mut self, values: &[ArrayRef], num_rows: usize) -> Result<ArrayRef> {
        let scores = values[0].as_primitive::<Float64Type>();
        let mut plain = Vec::with_capacity(num_rows);
        for (row, score) in scores.iter().enumerate() {
            match score {
                Some(s) if !s.is_finite() => {
                    return Err(Error::invalid(format!(
                        "drt_shape_weights: a score of {s} (a NULL score means none)"
                    ))
                    .at_column("score", Some(s.to_string()))
                    .at_row(row)
                    .into())
                }
                Some(s) => plain.push(s),
                None => plain.push(f64::NAN),
            }
        }
        Ok(Arc::new(Float64Array::from(self.0.weights(&plain))))
    }
}

/// Whether `t` holds bytes rather than text.
pub fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// `length` (`char_length`, `character_length`) or `octet_length`
/// (`builtin`, DataFusion's) that also takes a binary value and counts its
/// bytes. DataFusion's own cast a payload's `data` to text: one that
/// happened to be UTF-8 was measured in characters (19 bytes answered
/// 16), one that was not could not be measured at all.
pub fn bytes_too(builtin: Arc<ScalarUDF>) -> ScalarUDF {
    ScalarUDF::from(BytesToo {
        builtin,
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct BytesToo {
    builtin: Arc<ScalarUDF>,
    signature: Signature,
}

impl BytesToo {
    fn of_bytes(types: &[DataType]) -> bool {
        matches!(types, [t] if is_binary(t))
    }
}

impl ScalarUDFImpl for BytesToo {
    fn name(&self) -> &str {
        self.builtin.name()
    }

    fn aliases(&self) -> &[String] {
        self.builtin.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if Self::of_bytes(arg_types) {
            return Ok(vec![DataType::BinaryView]);
        }
        let fields: Vec<FieldRef> = arg_types
            .iter()
            .map(|t| Arc::new(Field::new("x", t.clone(), true)))
            .collect();
        let coerced = fields_with_udf(&fields, self.builtin.as_ref())?;
        Ok(coerced.iter().map(|f| f.data_type().clone()).collect())
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match Self::of_bytes(arg_types) {
            true => Ok(DataType::Int64),
            false => self.builtin.return_type(arg_types),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        if !Self::of_bytes(&types) {
            return self.builtin.invoke_with_args(args);
        }
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let bytes = arrays[0].as_binary_view();
        let out: Int64Array = bytes.iter().map(|v| v.map(|v| v.len() as i64)).collect();
        Ok(match &args.args[0] {
            ColumnarValue::Scalar(_) => {
                ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
            }
            ColumnarValue::Array(_) => ColumnarValue::Array(Arc::new(out)),
        })
    }
}

/// A hash of bytes or text as lowercase hex, `NULL` for `NULL`: `md5(x)` and
/// `sha256(x)` over a payload's `data` or any text (its UTF-8 bytes), as
/// PostgreSQL and DuckDB answer them.
fn hex_hash(name: &str, hash: fn(&[u8]) -> Vec<u8>) -> ScalarUDF {
    let hex = move |v: &[u8]| {
        hash(v).iter().fold(String::with_capacity(64), |mut s, b| {
            s.push_str(&format!("{b:02x}"));
            s
        })
    };
    let fun = move |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let scalar = matches!(args[0], ColumnarValue::Scalar(_));
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let out: StringArray = match arrays[0].data_type() {
            DataType::Utf8View => arrays[0]
                .as_string_view()
                .iter()
                .map(|v| v.map(|v| hex(v.as_bytes())))
                .collect(),
            _ => arrays[0]
                .as_binary_view()
                .iter()
                .map(|v| v.map(hex))
                .collect(),
        };
        Ok(match scalar {
            true => ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?),
            false => ColumnarValue::Array(Arc::new(out)),
        })
    };
    ScalarUDF::from(SimpleScalarUDF::new_with_signature(
        name,
        Signature::uniform(
            1,
            vec![DataType::BinaryView, DataType::Utf8View],
            Volatility::Immutable,
        ),
        DataType::Utf8,
        Arc::new(fun),
    ))
}

/// `md5(x) -> VARCHAR`, 32 hex digits.
pub fn md5() -> ScalarUDF {
    use md5::Digest;
    hex_hash("md5", |v| md5::Md5::digest(v).to_vec())
}

/// `sha256(x) -> VARCHAR`, 64 hex digits.
pub fn sha256() -> ScalarUDF {
    use sha2::Digest;
    hex_hash("sha256", |v| sha2::Sha256::digest(v).to_vec())
}

/// `drt_canonical(x) -> x's type`: a float with one NaN (sign bit clear)
/// and one zero (+0.0), the form every float of a query takes (see
/// `exec::floats`, whose rule wraps computed floats in it).
pub fn drt_canonical() -> ScalarUDF {
    ScalarUDF::from(Canonical {
        signature: Signature::uniform(
            1,
            vec![DataType::Float32, DataType::Float64],
            Volatility::Immutable,
        ),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Canonical {
    signature: Signature,
}

impl ScalarUDFImpl for Canonical {
    fn name(&self) -> &str {
        "drt_canonical"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    /// Its argument's field: a null only where the argument has one, so the
    /// plan's schema (a non-null `coalesce`, say) stays as it was.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(args.arg_fields[0].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(match &args.args[0] {
            ColumnarValue::Array(a) => ColumnarValue::Array(
                super::exec::canonical(a.as_ref()).unwrap_or_else(|| a.clone()),
            ),
            ColumnarValue::Scalar(s) => {
                let a = s.to_array()?;
                let a = super::exec::canonical(a.as_ref()).unwrap_or(a);
                ColumnarValue::Scalar(ScalarValue::try_from_array(&a, 0)?)
            }
        })
    }
}

/// `min` and `max` as SQL has them over floats: DataFusion 55's grouped
/// accumulators for floats compare with `<` (a NaN neither wins nor loses,
/// and a group of NaNs answers `f64::MIN`), while its one-group accumulator
/// orders NaN above every number, as SQL does. Over a float argument this
/// wrapper takes the one-group accumulator per group (slower, right);
/// every other type, and everything else, is the builtin's.
pub fn nan_ordered(builtin: Arc<AggregateUDF>) -> AggregateUDF {
    AggregateUDF::new_from_impl(NanOrdered { builtin })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct NanOrdered {
    builtin: Arc<AggregateUDF>,
}

impl AggregateUDFImpl for NanOrdered {
    fn name(&self) -> &str {
        self.builtin.name()
    }

    fn aliases(&self) -> &[String] {
        self.builtin.aliases()
    }

    fn signature(&self) -> &Signature {
        self.builtin.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.builtin.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        self.builtin.return_field(arg_fields)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.builtin.coerce_types(arg_types)
    }

    fn is_nullable(&self) -> bool {
        self.builtin.is_nullable()
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.builtin.accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.builtin.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        let float = args.expr_fields.iter().any(|f| f.data_type().is_floating());
        !float && self.builtin.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        self.builtin.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.builtin.create_sliding_accumulator(args)
    }

    fn is_descending(&self) -> Option<bool> {
        self.builtin.is_descending()
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.builtin.default_value(data_type)
    }

    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        self.builtin.documentation()
    }
}
