//! Ordinary sorts plan: two rules around DataFusion's ordering analysis,
//! which can fail to see an ordering a plan delivers. A plan it cannot
//! prove ordered fails its sanity check ("does not satisfy order
//! requirements"), so these were queries the engine refused, never wrong
//! rows:
//!
//! * [`SortKeysAsColumns`]: a sort by an expression (`ORDER BY sqrt(w)`)
//!   sorts by a column computed just below it. DataFusion asks each function
//!   in a sort key how it orders its input; `sqrt`, `ln` and `abs` over an
//!   input whose range it cannot bound answer with an error, the analysis
//!   gives up, and a merge of sorted partitions above the sort sees no
//!   order. A column is ordered by being sorted, with no question asked.
//! * [`EnsureOrderings`]: the last rule before the sanity check sorts the
//!   input of any node whose required ordering its input is not known to
//!   have. DataFusion's own sort enforcement relies on each child's
//!   reasons (`UNION ALL` branches, one ordered by equal columns and one by
//!   a constant, each skip a key the union then does not know), and our
//!   rules replace nodes after it ran.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, Sort, SortExpr};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Last among the logical rules: `Sort [f(a)]` becomes
/// `Projection [input] ← Sort [k] ← Projection [input, f(a) AS k]`, the
/// same rows in the same order with the same columns.
#[derive(Debug, Default)]
pub struct SortKeysAsColumns;

/// A name for sort key `i` that no column of `schema` has.
fn key_name(schema: &DFSchema, i: usize) -> String {
    (0..)
        .map(|n| match n {
            0 => format!("__drt_sort_key_{i}"),
            n => format!("__drt_sort_key_{i}_{n}"),
        })
        .find(|name| !schema.fields().iter().any(|f| f.name() == name))
        .unwrap_or_default()
}

impl SortKeysAsColumns {
    fn node(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Sort(sort) = plan else {
            return Ok(Transformed::no(plan));
        };
        if sort
            .expr
            .iter()
            .all(|key| matches!(key.expr, Expr::Column(_)))
        {
            return Ok(Transformed::no(LogicalPlan::Sort(sort)));
        }
        let schema = Arc::clone(sort.input.schema());
        let passed: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
        let mut computed = Vec::new();
        let keys = sort
            .expr
            .into_iter()
            .enumerate()
            .map(|(i, key)| match key.expr {
                Expr::Column(_) => key,
                expr => {
                    let name = key_name(&schema, i);
                    computed.push(expr.alias(&name));
                    SortExpr::new(
                        Expr::Column(Column::from_name(name)),
                        key.asc,
                        key.nulls_first,
                    )
                }
            })
            .collect();
        let below =
            Projection::try_new(passed.iter().cloned().chain(computed).collect(), sort.input)?;
        let sorted = Sort {
            expr: keys,
            input: Arc::new(LogicalPlan::Projection(below)),
            fetch: sort.fetch,
        };
        let above = Projection::try_new(passed, Arc::new(LogicalPlan::Sort(sorted)))?;
        Ok(Transformed::yes(LogicalPlan::Projection(above)))
    }
}

impl OptimizerRule for SortKeysAsColumns {
    fn name(&self) -> &str {
        "sort_keys_as_columns"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        Self::node(plan)
    }
}

/// Sorts (per partition) the input of a node whose required ordering the
/// input is not known to have: a sort too many where DataFusion cannot see
/// an order, never a plan refused or rows out of order.
#[derive(Debug, Default)]
pub struct EnsureOrderings;

impl PhysicalOptimizerRule for EnsureOrderings {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let mut changed = false;
            let mut children = Vec::new();
            for (child, required) in node
                .children()
                .into_iter()
                .zip(node.required_input_ordering())
            {
                let child = Arc::clone(child);
                let Some(required) = required.map(|r| r.into_single()) else {
                    children.push(child);
                    continue;
                };
                if child
                    .equivalence_properties()
                    .ordering_satisfy_requirement(required.clone())?
                {
                    children.push(child);
                    continue;
                }
                let ordering = LexOrdering::from(required);
                changed = true;
                children.push(Arc::new(
                    SortExec::new(ordering, child).with_preserve_partitioning(true),
                ));
            }
            match changed {
                true => Ok(Transformed::yes(replace_children_if_necessary(
                    node, children,
                )?)),
                false => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "ensure_orderings"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
