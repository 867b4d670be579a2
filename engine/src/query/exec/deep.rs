//! `BalanceChains`: a long chain of `AND`, `OR` or `||` becomes a balanced
//! tree of the same terms in the same order. (`query::parse` regroups the
//! chains of the SQL text; this rule keeps them so through DataFusion's
//! rules, which build conjunctions anew.)
//!
//! SQL a notebook generates is often one long chain (`sample_id = 1 OR
//! sample_id = 2 OR ...`, 10,000 conditions ANDed together). Parsed, it is a
//! tree as deep as it is long, and DataFusion both recurses down it (a
//! 1,000-term chain overflowed an engine thread's stack) and, simplifying
//! `A AND B` where `A` already contains `B`, searches the left side at every
//! level: quadratic (20,000 terms took minutes to plan), as is type
//! coercion. So this rule runs first in the analyzer, and first and last in
//! each optimizer pass (DataFusion's own rules rebuild conjunctions
//! left-deep, `conjunction`). These operators are associative
//! in SQL's three-valued logic (and for strings), so regrouping keeps every
//! answer; the terms keep their order. `+` is not regrouped: over floats or
//! near overflow the grouping changes the result.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result as DfResult;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};
use datafusion::optimizer::analyzer::AnalyzerRule;
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// Chains of at most this many terms keep the shape they were written in
/// (plans and their tests read as written).
const KEEP_UP_TO: usize = 16;

/// See the module: long chains of `AND`, `OR` and `||` made balanced.
#[derive(Debug, Default)]
pub struct BalanceChains;

fn associative(op: Operator) -> bool {
    matches!(op, Operator::And | Operator::Or | Operator::StringConcat)
}

/// The terms of the chain of `op` at `expr` (in order) and its depth, walked
/// without recursion.
fn chain(expr: &Expr, op: Operator) -> (Vec<&Expr>, usize) {
    let mut terms = Vec::new();
    let mut depth = 0;
    let mut stack = vec![(expr, 0usize)];
    while let Some((e, d)) = stack.pop() {
        match e {
            Expr::BinaryExpr(b) if b.op == op => {
                stack.push((&b.right, d + 1));
                stack.push((&b.left, d + 1));
            }
            other => {
                depth = depth.max(d);
                terms.push(other);
            }
        }
    }
    (terms, depth)
}

/// The terms of the chain of `op` at `expr`, taken apart without recursion.
fn take_terms(expr: Expr, op: Operator) -> Vec<Expr> {
    let mut terms = Vec::new();
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match e {
            Expr::BinaryExpr(b) if b.op == op => {
                stack.push(*b.right);
                stack.push(*b.left);
            }
            other => terms.push(other),
        }
    }
    terms
}

/// `terms` (at least one) joined by `op` as a balanced tree, in order.
fn balanced(mut terms: Vec<Expr>, op: Operator) -> Expr {
    if terms.len() == 1 {
        return terms.pop().expect("one term");
    }
    let right = terms.split_off(terms.len() / 2);
    Expr::BinaryExpr(BinaryExpr::new(
        Box::new(balanced(terms, op)),
        op,
        Box::new(balanced(right, op)),
    ))
}

/// `expr` with every long, unbalanced chain balanced.
pub fn balance(expr: Expr) -> DfResult<Transformed<Expr>> {
    expr.transform_down(|e| {
        let Expr::BinaryExpr(b) = &e else {
            return Ok(Transformed::no(e));
        };
        let op = b.op;
        if !associative(op) {
            return Ok(Transformed::no(e));
        }
        let (terms, depth) = chain(&e, op);
        let n = terms.len();
        // a balanced tree of n terms is ceil(log2 n) deep
        let shallow = usize::BITS - (n - 1).leading_zeros();
        if n <= KEEP_UP_TO || depth <= shallow as usize {
            return Ok(Transformed::no(e));
        }
        Ok(Transformed::yes(balanced(take_terms(e, op), op)))
    })
}

impl BalanceChains {
    /// `plan`'s expressions (not its inputs') with long chains balanced,
    /// each keeping its name.
    fn node(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        // a projection's unnamed column keeps the name it was written with
        let names = NamePreserver::new(&plan);
        plan.map_expressions(|expr| {
            let name = names.save(&expr);
            let out = balance(expr)?;
            Ok(match out.transformed {
                true => Transformed::yes(name.restore(out.data)),
                false => out,
            })
        })
    }
}

/// First among the analyzer's rules: type coercion asks each operator of a
/// chain for its operands' types, each a walk of that operand's whole
/// chain (quadratic on a left-deep one: 4,000 ANDs took 15 s to plan).
impl AnalyzerRule for BalanceChains {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        plan.transform_up_with_subqueries(Self::node)
            .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "balance_chains"
    }
}

impl OptimizerRule for BalanceChains {
    fn name(&self) -> &str {
        "balance_chains"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        Self::node(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    fn chain_of(n: usize, op: Operator) -> Expr {
        (1..n).fold(col("a").eq(lit(0i64)), |acc, i| {
            Expr::BinaryExpr(BinaryExpr::new(
                Box::new(acc),
                op,
                Box::new(col("a").eq(lit(i as i64))),
            ))
        })
    }

    #[test]
    fn a_long_chain_becomes_shallow_with_its_terms_in_order() {
        let long = chain_of(1000, Operator::Or);
        let (before, depth) = chain(&long, Operator::Or);
        assert_eq!(depth, 999);
        let before: Vec<Expr> = before.into_iter().cloned().collect();
        let out = balance(long).unwrap();
        assert!(out.transformed);
        let (after, depth) = chain(&out.data, Operator::Or);
        assert_eq!(depth, 10, "1,000 terms, balanced: 10 levels");
        assert_eq!(after.into_iter().cloned().collect::<Vec<_>>(), before);
        // a balanced chain is left as it is
        assert!(!balance(out.data).unwrap().transformed);
    }

    #[test]
    fn short_chains_and_other_operators_keep_their_shape() {
        assert!(
            !balance(chain_of(KEEP_UP_TO, Operator::And))
                .unwrap()
                .transformed
        );
        assert!(!balance(chain_of(500, Operator::Plus)).unwrap().transformed);
        // a chain inside another expression is found
        let inner = Expr::Not(Box::new(chain_of(100, Operator::And)));
        assert!(balance(inner).unwrap().transformed);
    }
}
