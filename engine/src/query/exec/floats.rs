//! SQL's float semantics, which Arrow's order and DataFusion's hash tables
//! do not keep on their own. In SQL (DuckDB and PostgreSQL answer so) every
//! NaN is one value, equal to itself and greater than every number, and
//! -0.0 equals 0.0. Arrow orders floats by IEEE 754's totalOrder, where a
//! NaN with its sign bit set (what x86 computes for `0/0` or `inf - inf`)
//! sorts below `-inf`, and DataFusion's hash tables (`IN` lists, `GROUP BY`,
//! `DISTINCT`, joins) compare bits: grouped `min`/`max`, `IN`, `NULLIF`,
//! sorts and joins gave wrong rows over such values.
//!
//! The engine keeps one representative of each instead: every float value
//! a query reads or computes is *canonical*, NaN as `f64::NAN` (sign bit
//! clear) and zero as +0.0. Over canonical values totalOrder and bit
//! equality are SQL's order and equality. Values enter canonical
//! ([`canonical_batch`]: the `metadata` scan, registered tables), and
//! [`CanonicalFloats`] keeps computed ones so: every float-typed arithmetic,
//! function call and cast from text, every float aggregate and window
//! result, is wrapped in `drt_canonical`, and float literals are written
//! canonical. So SQL returns 0.0 for a stored -0.0. Floats inside nested
//! types (lists, structs) are left as they are.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{
    BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, Projection, ScalarUDF,
};
use datafusion::optimizer::analyzer::AnalyzerRule;

use crate::query::udf;

/// A float type whose values [`canonical`] rewrites.
pub fn is_float(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Float32 | DataType::Float64)
}

/// Whether `v` is canonical: not -0.0, and not a NaN other than `NAN`.
trait Canonical: Copy {
    fn canonical(self) -> Self;
    fn is_canonical(self) -> bool;
}

macro_rules! canonical_float {
    ($t:ty) => {
        impl Canonical for $t {
            fn canonical(self) -> Self {
                if self.is_nan() {
                    <$t>::NAN
                } else {
                    // -0.0 + 0.0 is +0.0; every other value is itself
                    self + 0.0
                }
            }
            fn is_canonical(self) -> bool {
                self.to_bits() == self.canonical().to_bits()
            }
        }
    };
}
canonical_float!(f32);
canonical_float!(f64);

fn canonical_primitive<T>(array: &PrimitiveArray<T>) -> Option<ArrayRef>
where
    T: ArrowPrimitiveType,
    T::Native: Canonical,
{
    // a null slot may hold any bits: only valid values count, but all are
    // rewritten (the nulls stay nulls)
    let all = array.values().iter().all(|v| v.is_canonical());
    match all {
        true => None,
        false => Some(Arc::new(array.unary::<_, T>(|v| v.canonical()))),
    }
}

/// `array` with its float values canonical, or `None` when they already
/// are (the common case: a pass that reads and does not copy).
pub fn canonical(array: &dyn Array) -> Option<ArrayRef> {
    match array.data_type() {
        DataType::Float32 => canonical_primitive(array.as_primitive::<Float32Type>()),
        DataType::Float64 => canonical_primitive(array.as_primitive::<Float64Type>()),
        _ => None,
    }
}

/// `batch` with every top-level float column canonical: the batch itself
/// when they already are.
pub fn canonical_batch(batch: RecordBatch) -> DfResult<RecordBatch> {
    let changed: Vec<(usize, ArrayRef)> = batch
        .columns()
        .iter()
        .enumerate()
        .filter_map(|(i, c)| canonical(c.as_ref()).map(|c| (i, c)))
        .collect();
    if changed.is_empty() {
        return Ok(batch);
    }
    let mut columns = batch.columns().to_vec();
    for (i, column) in changed {
        columns[i] = column;
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &options,
    )?)
}

/// The analyzer rule of the module: computed floats canonical, in every
/// node of the plan and its subqueries. It runs after type coercion, and
/// before the optimizer folds constants (so `NULLIF(-0.0, 0.0)` folds to
/// NULL, as SQL has it).
#[derive(Debug, Default)]
pub struct CanonicalFloats;

impl AnalyzerRule for CanonicalFloats {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DfResult<LogicalPlan> {
        let canon = Arc::new(udf::drt_canonical());
        let plan = plan
            .transform_up_with_subqueries(|node| canonical_node(node, &canon))?
            .data;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "canonical_floats"
    }
}

/// One node: its expressions' computed floats wrapped, and, over an
/// aggregate or a window, a projection that makes their float results
/// canonical (`sum` of `inf` and `-inf` is a NaN of either sign).
fn canonical_node(node: LogicalPlan, canon: &Arc<ScalarUDF>) -> DfResult<Transformed<LogicalPlan>> {
    let schema = merge_schema(&node.inputs());
    // the names a node's output takes from its expressions stay
    let names = matches!(
        node,
        LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)
    )
    .then(|| NamePreserver::new(&node));
    let node = node.map_expressions(|expr| {
        let saved = names.as_ref().map(|n| n.save(&expr));
        let out = expr.transform_up(|e| wrap(e, &schema, canon))?;
        match (out.transformed, saved) {
            (true, Some(saved)) => Ok(Transformed::yes(saved.restore(out.data))),
            _ => Ok(out),
        }
    })?;
    let node = match node.transformed {
        true => Transformed::yes(node.data.recompute_schema()?),
        false => node,
    };
    node.transform_data(|node| results_canonical(node, canon))
}

/// `e`, wrapped when it computes a float (its children are already done).
fn wrap(e: Expr, schema: &DFSchema, canon: &Arc<ScalarUDF>) -> DfResult<Transformed<Expr>> {
    if let Expr::Literal(value, meta) = &e {
        let canonical = match value {
            ScalarValue::Float64(Some(v)) if !v.is_canonical() => {
                ScalarValue::Float64(Some(v.canonical()))
            }
            ScalarValue::Float32(Some(v)) if !v.is_canonical() => {
                ScalarValue::Float32(Some(v.canonical()))
            }
            _ => return Ok(Transformed::no(e)),
        };
        return Ok(Transformed::yes(Expr::Literal(canonical, meta.clone())));
    }
    let computes = match &e {
        Expr::BinaryExpr(BinaryExpr { op, .. }) => matches!(
            op,
            Operator::Plus
                | Operator::Minus
                | Operator::Multiply
                | Operator::Divide
                | Operator::Modulo
        ),
        Expr::Negative(_) => true,
        Expr::ScalarFunction(f) => f.func.name() != canon.name(),
        // text can spell "-0" and "-nan"; a float or an integer cast to a
        // float stays canonical
        Expr::Cast(c) => text(&c.expr, schema),
        Expr::TryCast(c) => text(&c.expr, schema),
        _ => false,
    };
    // a type that cannot be worked out (an error the planner reports
    // elsewhere) is left to it
    let float = computes && e.get_type(schema).is_ok_and(|t| is_float(&t));
    match float {
        true => Ok(Transformed::yes(call(canon, e))),
        false => Ok(Transformed::no(e)),
    }
}

fn text(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema).is_ok_and(|t| {
        matches!(
            t,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        )
    })
}

fn call(canon: &Arc<ScalarUDF>, e: Expr) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(canon.clone(), vec![e]))
}

/// Over an aggregate or a window with float results, a projection that
/// passes every column on and makes those results canonical, by the same
/// names.
fn results_canonical(
    node: LogicalPlan,
    canon: &Arc<ScalarUDF>,
) -> DfResult<Transformed<LogicalPlan>> {
    let computed = match &node {
        // the group keys (and a grouping set's id) come first, and are the
        // input's values
        LogicalPlan::Aggregate(a) => a.schema.fields().len() - a.aggr_expr.len(),
        LogicalPlan::Window(w) => w.input.schema().fields().len(),
        _ => return Ok(Transformed::no(node)),
    };
    let schema = node.schema().clone();
    let floats = schema
        .iter()
        .skip(computed)
        .any(|(_, field)| is_float(field.data_type()));
    if !floats {
        return Ok(Transformed::no(node));
    }
    let exprs = schema
        .iter()
        .enumerate()
        .map(|(i, (qualifier, field))| {
            let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
            match i >= computed && is_float(field.data_type()) {
                true => call(canon, column).alias_qualified(qualifier.cloned(), field.name()),
                false => column,
            }
        })
        .collect();
    let projection = Projection::try_new(exprs, Arc::new(node))?;
    Ok(Transformed::yes(LogicalPlan::Projection(projection)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Float64Array;

    #[test]
    fn one_nan_and_one_zero() {
        let negative_nan = f64::from_bits(0xfff8_0000_0000_0000);
        assert!(negative_nan.is_nan() && negative_nan.is_sign_negative());
        let array = Float64Array::from(vec![Some(-0.0), Some(negative_nan), None, Some(1.5)]);
        let out = canonical(&array).expect("rewritten");
        let out = out.as_primitive::<Float64Type>();
        assert_eq!(out.value(0).to_bits(), 0.0f64.to_bits());
        assert_eq!(out.value(1).to_bits(), f64::NAN.to_bits());
        assert!(out.is_null(2));
        assert_eq!(out.value(3), 1.5);
        // canonical already: not copied
        assert!(canonical(out).is_none());
    }
}
