//! Queries DataFusion 55 answers with wrong rows, refused before they run:
//! a wrong answer must never pass for a right one. (Each class also
//! reproduces in plain DataFusion; `docs/sql.md` lists them.)
//!
//! - `x NOT IN (SELECT c ...)` where `x` or `c` can be NULL: SQL makes it
//!   NULL (not TRUE) when the subquery holds a NULL and no match, so a
//!   `WHERE` keeps no row; DataFusion keeps every row without a match.
//! - `x IN (SELECT c ...)` in any place but a conjunct of a `WHERE` (under
//!   `NOT`, `OR`, `IS [NOT] FALSE`, in a select list), where `x` or `c` can
//!   be NULL: there the difference between NULL and FALSE shows, and
//!   DataFusion answers FALSE. (As a conjunct of a filter, NULL and FALSE
//!   drop the row alike, and the answer is right.)
//!
//! `EXCEPT ALL` and `INTERSECT ALL` are refused while parsing
//! (`super::parse`).

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchema;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::expr::InSubquery;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};

use crate::Result;

/// Refuse `plan` if it, or a subquery of it, holds a shape of the module.
pub fn wrong_answers(plan: &LogicalPlan) -> Result<()> {
    plan.apply_with_subqueries(|node| {
        // the IN subqueries that are a conjunct of a filter: the safe place
        let safe: Vec<&Expr> = match node {
            LogicalPlan::Filter(filter) => split_conjunction(&filter.predicate)
                .into_iter()
                .filter(|e| matches!(e, Expr::InSubquery(s) if !s.negated))
                .collect(),
            _ => Vec::new(),
        };
        let schema = node
            .inputs()
            .first()
            .map(|input| input.schema().as_ref().clone());
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::InSubquery(sub) = e {
                    let placed = safe.iter().any(|s| std::ptr::eq(*s, e));
                    if (sub.negated || !placed) && nullable(sub, schema.as_ref()) {
                        return Err(refusal(sub));
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(())
}

/// Whether either side of an IN subquery can be NULL (unknown counts as can).
fn nullable(sub: &InSubquery, schema: Option<&DFSchema>) -> bool {
    let inner = sub
        .subquery
        .subquery
        .schema()
        .fields()
        .iter()
        .any(|f| f.is_nullable());
    let outer = schema.is_none_or(|s| sub.expr.nullable(s).unwrap_or(true));
    inner || outer
}

fn refusal(sub: &InSubquery) -> DataFusionError {
    let (shape, instead) = if sub.negated {
        (
            "x NOT IN (SELECT c ...)",
            "NOT EXISTS (SELECT 1 FROM ... WHERE c = x): the same rows when c holds no \
             NULL (when it does, SQL's NOT IN keeps no row at all)",
        )
    } else {
        (
            "x IN (SELECT c ...) under NOT, OR, IS or in a select list",
            "EXISTS (SELECT 1 FROM ... WHERE c = x), which is never NULL",
        )
    };
    DataFusionError::Plan(format!(
        "{shape} over a column that can be NULL is refused: DataFusion 55 answers it \
         without SQL's NULL rule (a NULL in the subquery and no match make it NULL, not \
         TRUE or FALSE), which gives wrong rows. Write {instead} (nothing was run)"
    ))
}
