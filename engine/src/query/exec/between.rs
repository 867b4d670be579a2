//! `x BETWEEN low AND high` as `x >= low AND x <= high`, before types are
//! coerced. DataFusion coerces the three operands of a `BETWEEN` to one
//! type, and an unsigned and a signed integer with a float meet in a
//! decimal that cannot hold infinity: `u BETWEEN 1 AND 'inf'::double` over
//! a UInt64 column failed ("Cannot cast to Decimal128(35, 15)"), where SQL
//! (and DuckDB) compares each pair on its own and answers. The two forms are
//! one in SQL, NULLs included; a volatile `x` (`random()`) is evaluated
//! once, so it keeps its `BETWEEN`.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::expr::Between;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::analyzer::AnalyzerRule;

/// Before DataFusion's type coercion: each `BETWEEN` of a non-volatile
/// operand as two comparisons (`NOT BETWEEN` as `x < low OR x > high`),
/// the names of output columns kept.
#[derive(Debug, Default)]
pub struct BetweenAsComparisons;

fn comparisons(e: Expr) -> DfResult<Transformed<Expr>> {
    let Expr::Between(Between {
        expr,
        negated,
        low,
        high,
    }) = e
    else {
        return Ok(Transformed::no(e));
    };
    if expr.is_volatile() {
        let kept = Expr::Between(Between::new(expr, negated, low, high));
        return Ok(Transformed::no(kept));
    }
    let x = *expr;
    Ok(Transformed::yes(match negated {
        false => x.clone().gt_eq(*low).and(x.lt_eq(*high)),
        true => x.clone().lt(*low).or(x.gt(*high)),
    }))
}

fn node(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    let names = NamePreserver::new(&plan);
    let plan = plan.map_expressions(|expr| {
        let saved = names.save(&expr);
        let out = expr.transform_up(comparisons)?;
        match out.transformed {
            true => Ok(Transformed::yes(saved.restore(out.data))),
            false => Ok(out),
        }
    })?;
    match plan.transformed {
        true => Ok(Transformed::yes(plan.data.recompute_schema()?)),
        false => Ok(plan),
    }
}

impl AnalyzerRule for BetweenAsComparisons {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DfResult<LogicalPlan> {
        Ok(plan.transform_up_with_subqueries(node)?.data)
    }

    fn name(&self) -> &str {
        "between_as_comparisons"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn between_is_two_comparisons_and_not_between_their_negation() {
        let between = col("u").between(lit(1i64), lit(f64::INFINITY));
        let out = comparisons(between).unwrap();
        assert!(out.transformed);
        let want = col("u")
            .gt_eq(lit(1i64))
            .and(col("u").lt_eq(lit(f64::INFINITY)));
        assert_eq!(out.data, want);
        let outside = col("u").not_between(lit(1i64), lit(2i64));
        let want = col("u").lt(lit(1i64)).or(col("u").gt(lit(2i64)));
        assert_eq!(comparisons(outside).unwrap().data, want);
    }
}
