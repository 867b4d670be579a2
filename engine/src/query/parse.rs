//! SQL text to a logical plan, for SQL of any length a user can type or
//! generate.
//!
//! The parser reads a chain of binary operators (`a = 1 OR a = 2 OR ...`)
//! in a loop, so its recursion limit never sees one; the tree it builds is
//! as deep as the chain is long, and DataFusion's SQL planner asks each
//! operator for its operands' types, a walk of the operand's whole chain:
//! quadratic (a 20,000-term `||` chain took two minutes to plan, a `+`
//! chain one minute, in a debug build). Before planning, each chain of
//! `AND`, `OR` or `||` longer than a few terms is regrouped into a balanced
//! tree of the same terms in the same order (these operators are
//! associative, in SQL's three-valued logic too), and a statement whose
//! operators are still nested deeper than [`MAX_DEPTH`] (a long chain of
//! `+`, which is not regrouped: over floats or near overflow the grouping
//! changes the result) is refused before any planning. See also
//! [`super::exec::BalanceChains`], which keeps chains balanced through
//! DataFusion's rules.

use std::ops::ControlFlow;

use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Ident, Query, SetExpr, SetOperator, SetQuantifier, VisitMut, VisitorMut,
};

use crate::Result;

/// Operators nested deeper than this, after regrouping, are refused: at
/// 1,000 a `+` chain plans in under a second in a debug build.
pub const MAX_DEPTH: usize = 2_000;

/// Chains of at most this many terms keep the shape they were written in.
const KEEP_UP_TO: usize = 16;

/// Parse `sql` (one statement), regroup its long chains, refuse what is
/// nested too deep, and plan it.
pub async fn logical_plan(state: &SessionState, sql: &str) -> Result<LogicalPlan> {
    let dialect = state.config().options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    shape(&mut statement)?;
    Ok(state.statement_to_plan(statement).await?)
}

/// Regroup the long chains of `statement` and check its depth.
fn shape(statement: &mut Statement) -> Result<()> {
    let mut visitor = Chains::default();
    let flow = match statement {
        Statement::Statement(s) => s.visit(&mut visitor),
        Statement::Explain(e) => return shape(&mut e.statement),
        // COPY and CREATE EXTERNAL TABLE are refused once planned
        _ => ControlFlow::Continue(()),
    };
    match flow {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e.into()),
    }
}

/// Visits every expression; at the top of each region of binary operators
/// (an operator whose parent is not one) regroups and measures it.
#[derive(Default)]
struct Chains {
    /// For each expression being visited, outermost first: whether it is a
    /// binary operator.
    open: Vec<bool>,
}

fn associative(op: &BinaryOperator) -> bool {
    matches!(
        op,
        BinaryOperator::And | BinaryOperator::Or | BinaryOperator::StringConcat
    )
}

/// The terms of the chain of `op` at `expr`, taken apart in order without
/// recursion (`expr` is left a placeholder).
fn take_terms(expr: &mut Expr, op: &BinaryOperator) -> Vec<Expr> {
    let mut terms = Vec::new();
    let mut stack = vec![std::mem::replace(expr, Expr::Identifier(Ident::new("")))];
    while let Some(e) = stack.pop() {
        match e {
            Expr::BinaryOp { left, op: o, right } if &o == op => {
                stack.push(*right);
                stack.push(*left);
            }
            other => terms.push(other),
        }
    }
    terms
}

/// The number of terms of the chain of `op` at `expr` and its depth.
fn measure(expr: &Expr, op: Option<&BinaryOperator>) -> (usize, usize) {
    let (mut terms, mut deepest) = (0, 0);
    let mut stack = vec![(expr, 0usize)];
    while let Some((e, d)) = stack.pop() {
        match e {
            Expr::BinaryOp { left, op: o, right } if op.is_none_or(|op| op == o) => {
                stack.push((right, d + 1));
                stack.push((left, d + 1));
            }
            _ => {
                terms += 1;
                deepest = deepest.max(d);
            }
        }
    }
    (terms, deepest)
}

/// `terms` (at least one) joined by `op` as a balanced tree, in order.
fn balanced(mut terms: Vec<Expr>, op: &BinaryOperator) -> Expr {
    if terms.len() == 1 {
        return terms.pop().expect("one term");
    }
    let right = terms.split_off(terms.len() / 2);
    Expr::BinaryOp {
        left: Box::new(balanced(terms, op)),
        op: op.clone(),
        right: Box::new(balanced(right, op)),
    }
}

/// Regroup every long chain of an associative operator in the region of
/// binary operators at `expr`, top down, without recursion on the chains.
fn regroup(expr: &mut Expr) {
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        let op = match e {
            Expr::BinaryOp { op, .. } => op.clone(),
            _ => continue,
        };
        if associative(&op) {
            let (terms, depth) = measure(e, Some(&op));
            let shallow = (usize::BITS - (terms - 1).leading_zeros()) as usize;
            if terms > KEEP_UP_TO && depth > shallow {
                *e = balanced(take_terms(e, &op), &op);
            }
        }
        if let Expr::BinaryOp { left, right, .. } = e {
            stack.push(&mut **left);
            stack.push(&mut **right);
        }
    }
}

/// The first `EXCEPT ALL` or `INTERSECT ALL` of a query's body: DataFusion 55
/// answers them with the wrong multiplicities (`[1, 1, 2] EXCEPT ALL [1]`
/// gives `[2]`, not `[1, 2]`), so they are refused before planning.
fn wrong_set_operation(body: &SetExpr) -> Option<&'static str> {
    match body {
        SetExpr::SetOperation {
            op,
            set_quantifier,
            left,
            right,
        } => {
            let all = matches!(
                set_quantifier,
                SetQuantifier::All | SetQuantifier::AllByName
            );
            match op {
                SetOperator::Except | SetOperator::Minus if all => Some("EXCEPT ALL"),
                SetOperator::Intersect if all => Some("INTERSECT ALL"),
                _ => wrong_set_operation(left).or_else(|| wrong_set_operation(right)),
            }
        }
        SetExpr::Query(query) => wrong_set_operation(&query.body),
        _ => None,
    }
}

impl VisitorMut for Chains {
    type Break = DataFusionError;

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<DataFusionError> {
        match wrong_set_operation(&query.body) {
            None => ControlFlow::Continue(()),
            Some(op) => ControlFlow::Break(DataFusionError::Plan(format!(
                "{op} is refused: DataFusion 55 returns the wrong number of copies of a \
                 row (each row must appear max(m - n, 0) times for EXCEPT ALL, min(m, n) for \
                 INTERSECT ALL). Number the copies and compare distinct rows instead: \
                 SELECT x, row_number() OVER (PARTITION BY x) AS k FROM a EXCEPT SELECT x, \
                 row_number() OVER (PARTITION BY x) AS k FROM b (then drop k) (nothing was \
                 run)"
            ))),
        }
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<DataFusionError> {
        let binary = matches!(expr, Expr::BinaryOp { .. });
        let top = binary && self.open.last() != Some(&true);
        self.open.push(binary);
        if top {
            regroup(expr);
            let (_, depth) = measure(expr, None);
            if depth > MAX_DEPTH {
                return ControlFlow::Break(DataFusionError::Plan(format!(
                    "an expression of this query nests {depth} operators; at most \
                     {MAX_DEPTH} are planned (chains of AND, OR and || are regrouped and may \
                     be of any length): split a long chain of arithmetic, e.g. into a sum \
                     over rows (nothing was run)"
                )));
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _expr: &mut Expr) -> ControlFlow<DataFusionError> {
        self.open.pop();
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    fn parsed(sql: &str) -> Statement {
        DFParser::parse_sql(sql).unwrap().pop_front().unwrap()
    }

    #[test]
    fn a_long_or_chain_is_regrouped_with_its_terms_in_order() {
        let terms: Vec<String> = (0..1000).map(|i| format!("a = {i}")).collect();
        let mut s = parsed(&format!("SELECT * FROM t WHERE {}", terms.join(" OR ")));
        shape(&mut s).unwrap();
        let text = s.to_string();
        // the same terms, in order (regrouping adds no parentheses to the text)
        assert!(text.ends_with(&terms.join(" OR ")), "{text}");
        let Statement::Statement(q) = &s else {
            panic!("a query")
        };
        let mut depth = 0;
        let _ = datafusion::sql::sqlparser::ast::Visit::visit(&**q, &mut DepthOf(&mut depth));
        // 1,000 terms balanced: 10 levels of OR, and each term's `=`
        assert_eq!(depth, 11);
    }

    /// The deepest binary-operator region of a statement.
    struct DepthOf<'a>(&'a mut usize);

    impl datafusion::sql::sqlparser::ast::Visitor for DepthOf<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            *self.0 = (*self.0).max(measure(expr, None).1);
            ControlFlow::Continue(())
        }
    }

    #[test]
    fn a_chain_of_arithmetic_past_the_limit_is_refused_before_planning() {
        let sum = vec!["1"; MAX_DEPTH + 2].join(" + ");
        let mut s = parsed(&format!("SELECT {sum}"));
        let err = shape(&mut s).unwrap_err().to_string();
        assert!(err.contains("nests 2001 operators"), "{err}");
        // at the limit it passes, and inside EXPLAIN too
        let sum = vec!["1"; MAX_DEPTH + 1].join(" + ");
        shape(&mut parsed(&format!("EXPLAIN SELECT {sum}"))).unwrap();
    }

    #[test]
    fn short_chains_keep_their_shape() {
        let mut s = parsed("SELECT * FROM t WHERE a = 1 AND b = 2 AND c = 3");
        let before = format!("{s:?}");
        shape(&mut s).unwrap();
        assert_eq!(format!("{s:?}"), before);
    }
}
