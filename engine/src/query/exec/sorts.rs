//! Ordinary sorts plan: two rules around DataFusion's ordering analysis,
//! which can fail to see an ordering a plan delivers. A plan it cannot
//! prove ordered fails its sanity check ("does not satisfy order
//! requirements"), so these were queries the engine refused, never wrong
//! rows:
//!
//! * [`SortKeysAsColumns`]: a sort by an expression (`ORDER BY sqrt(w)`,
//!   also a window's `OVER (ORDER BY sqrt(w))`) sorts by a column computed
//!   just below it. DataFusion asks each function
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
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, Sort, SortExpr, Window};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Last among the logical rules: `Sort [f(a)]` becomes
/// `Projection [input] ← Sort [k] ← Projection [input, f(a) AS k]`, the
/// same rows in the same order with the same columns; a window's computed
/// `PARTITION BY` and `ORDER BY` keys become columns so too.
#[derive(Debug, Default)]
pub struct SortKeysAsColumns;

/// A name for key `i` of a sort (`kind` "sort") or a window ("window")
/// that no column of `schema` has.
fn key_name(schema: &DFSchema, kind: &str, i: usize) -> String {
    (0..)
        .map(|n| match n {
            0 => format!("__drt_{kind}_key_{i}"),
            n => format!("__drt_{kind}_key_{i}_{n}"),
        })
        .find(|name| !schema.fields().iter().any(|f| f.name() == name))
        .unwrap_or_default()
}

/// The keys a window's `PARTITION BY` and `ORDER BY` compute, as columns
/// of a projection below it: the column each becomes, and the projection's
/// new expressions.
struct WindowKeys<'a> {
    schema: &'a DFSchema,
    computed: Vec<(Expr, String)>,
}

impl WindowKeys<'_> {
    fn column(&mut self, expr: Expr) -> Expr {
        if matches!(expr, Expr::Column(_)) {
            return expr;
        }
        let name = match self.computed.iter().find(|(e, _)| *e == expr) {
            Some((_, name)) => name.clone(),
            None => {
                let name = key_name(self.schema, "window", self.computed.len());
                self.computed.push((expr, name.clone()));
                name
            }
        };
        Expr::Column(Column::from_name(name))
    }

    /// `expr` (a window function, maybe aliased) with its keys as columns.
    fn rewrite(&mut self, expr: Expr) -> DfResult<Transformed<Expr>> {
        expr.transform_up(|e| {
            let Expr::WindowFunction(mut f) = e else {
                return Ok(Transformed::no(e));
            };
            let params = &mut f.params;
            params.partition_by = std::mem::take(&mut params.partition_by)
                .into_iter()
                .map(|p| self.column(p))
                .collect();
            params.order_by = std::mem::take(&mut params.order_by)
                .into_iter()
                .map(|s| SortExpr::new(self.column(s.expr), s.asc, s.nulls_first))
                .collect();
            Ok(Transformed::yes(Expr::WindowFunction(f)))
        })
    }
}

/// A window whose `PARTITION BY` or `ORDER BY` computes (`OVER (ORDER BY
/// sqrt(w))`) reads those keys as columns of a projection below it, and a
/// projection above gives its outputs their names again.
fn window_node(window: Window) -> DfResult<Transformed<LogicalPlan>> {
    let schema = Arc::clone(window.input.schema());
    let mut keys = WindowKeys {
        schema: &schema,
        computed: Vec::new(),
    };
    let mut exprs = Vec::with_capacity(window.window_expr.len());
    for expr in &window.window_expr {
        exprs.push((
            expr.schema_name().to_string(),
            keys.rewrite(expr.clone())?.data,
        ));
    }
    if keys.computed.is_empty() {
        return Ok(Transformed::no(LogicalPlan::Window(window)));
    }
    let passed: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    let computed = keys.computed.into_iter().map(|(e, name)| e.alias(name));
    let below = Projection::try_new(
        passed.iter().cloned().chain(computed).collect(),
        window.input,
    )?;
    let outputs: Vec<Expr> = exprs
        .iter()
        .map(|(name, e)| Expr::Column(Column::from_name(e.schema_name().to_string())).alias(name))
        .collect();
    let window_exprs = exprs.into_iter().map(|(_, e)| e).collect();
    let windowed = Window::try_new(window_exprs, Arc::new(LogicalPlan::Projection(below)))?;
    let above = Projection::try_new(
        passed.into_iter().chain(outputs).collect(),
        Arc::new(LogicalPlan::Window(windowed)),
    )?;
    Ok(Transformed::yes(LogicalPlan::Projection(above)))
}

impl SortKeysAsColumns {
    fn node(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        let sort = match plan {
            LogicalPlan::Sort(sort) => sort,
            LogicalPlan::Window(window) => return window_node(window),
            other => return Ok(Transformed::no(other)),
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
                    let name = key_name(&schema, "sort", i);
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
