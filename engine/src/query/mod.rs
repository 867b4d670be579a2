//! DataFusion over the training population: table `metadata` is the active
//! snapshot, served zero-copy from its mapped file; `PayloadTakeExec` turns
//! identities into payload bytes.

#[cfg(feature = "distributed")]
pub mod distributed;
pub mod exec;
mod live;
pub mod memory;
mod metadata;
pub mod parse;
pub mod payloads;
mod refuse;
mod tables;
pub mod udf;

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::functions_aggregate::min_max;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::prelude::{SessionConfig, SessionContext};

pub use self::live::{LiveQuery, SELECT_RETRIES};
pub use self::metadata::MetadataTable;
use self::tables::Tables;
use crate::catalog::{PartitionEntry, Snapshot, StreamRecipe};
use crate::store::CacheSet;
use crate::Result;

/// Rows per output batch. DataFusion's default (8,192) would cut results into
/// many small chunks on their way to Python.
pub const BATCH_SIZE: usize = 1 << 16;

#[cfg(feature = "distributed")]
use distributed::coordinate;

/// Without the `distributed` feature there is nowhere else to run.
#[cfg(not(feature = "distributed"))]
fn coordinate(_state: SessionStateBuilder, _workers: &[String]) -> Result<SessionStateBuilder> {
    Err(crate::Error::invalid(
        "this build runs SQL in one process (the engine's `distributed` feature is off)",
    ))
}

/// Refuse, before anything runs, every statement that could read or write a
/// file or change a table behind the catalog's back: `COPY`, `CREATE
/// EXTERNAL TABLE`, DML (`INSERT`/`UPDATE`/`DELETE`), `SET` and other
/// session statements, catalogs, functions, indexes, and views (which would
/// keep an old `metadata`). Session-only tables (`CREATE TABLE x AS SELECT`,
/// `DROP`) stay: they hold query results in memory. `EXPLAIN ANALYZE` of a refused statement is
/// refused too (the whole plan is checked, subqueries included). Files
/// enter only through `register`.
pub fn read_only(plan: &LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    plan.apply_with_subqueries(|node| {
        let refused = match node {
            LogicalPlan::Copy(_) => {
                Some("COPY (write results out from Python, e.g. polars' write_parquet)")
            }
            LogicalPlan::Dml(_) => Some(
                "INSERT, UPDATE and DELETE (change the population with update_metadata or select)",
            ),
            LogicalPlan::Statement(_) => Some("SET, transactions and prepared statements"),
            LogicalPlan::Ddl(ddl) => match ddl {
                DdlStatement::CreateMemoryTable(_)
                | DdlStatement::DropTable(_)
                | DdlStatement::DropView(_) => None,
                // A view keeps the `metadata` table of the moment it was made:
                // selecting from it after an update would commit an old population.
                DdlStatement::CreateView(_) => Some("CREATE VIEW (a view would keep the population of the moment it was made; use CREATE TABLE ... AS, a copy, or a WITH clause)"),
                DdlStatement::CreateExternalTable(_) => {
                    Some("CREATE EXTERNAL TABLE (files enter through register())")
                }
                _ => Some("catalogs, schemas, functions and indexes"),
            },
            _ => None,
        };
        match refused {
            Some(what) => Err(datafusion::error::DataFusionError::Plan(format!(
                "SQL here is read-only: {what} is refused (nothing was run)"
            ))),
            None => Ok(TreeNodeRecursion::Continue),
        }
    })?;
    Ok(())
}

/// Run blocking work (file I/O, hashing, a lock) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| crate::Error::internal(format!("a blocking task failed: {e}")))?
}

/// A SQL session bound to one dataset.
pub struct QuerySession {
    ctx: SessionContext,
    /// The default schema, where `metadata` and registered tables are
    /// replaced in one step (a concurrent query never finds them missing).
    tables: Arc<Tables>,
    partitions: usize,
    /// The memory pool's limit, in bytes.
    memory_limit: usize,
}

impl QuerySession {
    /// A session with table `metadata` (the snapshot) and table `payloads`
    /// (the caches, sorted by id), joins to which plan to `PayloadTakeExec`.
    pub fn new(snapshot: &Arc<Snapshot>, caches: CacheSet) -> Result<Self> {
        Self::with_workers(snapshot, caches, &[])
    }

    /// A session whose queries over `metadata` run on `workers` (URLs of
    /// processes serving [`distributed::serve`]; none: in this process).
    pub fn with_workers(
        snapshot: &Arc<Snapshot>,
        caches: CacheSet,
        workers: &[String],
    ) -> Result<Self> {
        Self::with_limit(snapshot, caches, workers, None)
    }

    /// [`Self::with_workers`] whose queries hold at most `memory_limit`
    /// bytes (default: [`memory::memory_limit`]), spilling past it.
    pub fn with_limit(
        snapshot: &Arc<Snapshot>,
        caches: CacheSet,
        workers: &[String],
        memory_limit: Option<usize>,
    ) -> Result<Self> {
        let limit = match memory_limit {
            Some(limit) => limit,
            None => memory::memory_limit()?,
        };
        let partitions = crate::threads();
        let mut config = SessionConfig::new()
            .with_batch_size(BATCH_SIZE)
            .with_target_partitions(partitions)
            .with_information_schema(true);
        // DataFusion's top-k aggregation (`GROUP BY`/`DISTINCT` of a key,
        // `ORDER BY` it, `LIMIT`) finds groups with `==`, which a NaN key
        // never matches: it panicked ("unreachable") on one. Plain
        // aggregation then a top-k sort answers the same rows.
        config.options_mut().optimizer.enable_topk_aggregation = false;
        let rules = exec::Rules::ours();
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(memory::runtime(limit)?)
            .with_default_features()
            .with_analyzer_rules(rules.analyzer)
            .with_optimizer_rules(rules.logical)
            .with_physical_optimizer_rules(rules.physical)
            // before `coordinate`, whose planner plans on top of it
            .with_query_planner(Arc::new(exec::WritingPlanner));
        let state = match workers.is_empty() {
            true => state,
            false => coordinate(state, workers)?,
        };
        let state = state.build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_udf(udf::drt_uniform());
        ctx.register_udwf(udf::drt_shape_weights());
        // lengths of binary values count bytes; text keeps DataFusion's
        for name in ["character_length", "octet_length"] {
            if let Ok(builtin) = datafusion::execution::FunctionRegistry::udf(&ctx, name) {
                ctx.register_udf(udf::bytes_too(builtin));
            }
        }
        ctx.register_udf(udf::drt_canonical());
        for builtin in [min_max::min_udaf(), min_max::max_udaf()] {
            ctx.register_udaf(udf::nan_ordered(builtin));
        }
        ctx.register_udf(udf::md5());
        ctx.register_udf(udf::sha256());
        let tables = Arc::new(Tables::default());
        let options = ctx.copied_config();
        let defaults = &options.options().catalog;
        ctx.catalog(&defaults.default_catalog)
            .ok_or_else(|| crate::Error::invalid("the session has no default catalog"))?
            .register_schema(&defaults.default_schema, tables.clone())?;
        tables.replace(
            "payloads",
            Arc::new(payloads::PayloadsTable::new(caches, partitions)),
        );
        let session = QuerySession {
            ctx,
            tables,
            partitions,
            memory_limit: limit,
        };
        session.set_snapshot(snapshot)?;
        Ok(session)
    }

    /// Point table `metadata` at `snapshot`, and table `mixture` at its
    /// mixture (`column`, `value`, `share`; no rows without one).
    pub fn set_snapshot(&self, snapshot: &Arc<Snapshot>) -> Result<()> {
        let table = MetadataTable::new(snapshot.clone(), self.partitions);
        self.tables.replace("metadata", Arc::new(table));
        let (schema, batch) = tables::mixture_table(snapshot.mixture())?;
        self.tables.replace(
            "mixture",
            Arc::new(MemTable::try_new(schema, vec![vec![batch]])?),
        );
        Ok(())
    }

    /// Register (or replace) an in-memory table, e.g. model losses to join.
    /// Its rows are scanned in batches of at most the session's size: a
    /// sort over it spills one batch at a time, where one batch of a whole
    /// frame would have to fit in the memory limit. A batch big against
    /// the limit (over a sixteenth of it) is copied into such batches once,
    /// here: a slice would still count, and hold, its whole buffers.
    pub fn register(&self, name: &str, schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<()> {
        let mut cut = Vec::with_capacity(batches.len());
        for batch in batches {
            let big = batch.get_array_memory_size() > self.memory_limit / 16;
            for at in (0..batch.num_rows()).step_by(BATCH_SIZE) {
                let slice = batch.slice(at, BATCH_SIZE.min(batch.num_rows() - at));
                let slice = if big { compact(&slice)? } else { slice };
                // SQL's one NaN and one zero (exec::floats)
                cut.push(exec::canonical_batch(slice)?);
            }
        }
        let table = MemTable::try_new(schema, vec![cut])?;
        self.tables.replace(name, Arc::new(table));
        Ok(())
    }

    /// Run `query` and store its rows as the partitions of an update
    /// derived from `base` ([`crate::catalog::stream`]), each part of the
    /// result where it is computed (on the workers, in a distributed
    /// session); return the partitions stored, in the update's order, for
    /// the caller to commit. A statement that is not a query is refused.
    pub async fn write(
        &self,
        query: &str,
        recipe: StreamRecipe,
        base: Arc<Snapshot>,
    ) -> Result<Vec<PartitionEntry>> {
        let mut state = self.ctx.state();
        let plan = parse::logical_plan(&state, query).await?;
        read_only(&plan)?;
        refuse::wrong_answers(&plan)?;
        if matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::DescribeTable(_)) {
            return Err(crate::Error::invalid(
                "select commits the rows of a query: this statement returns none (nothing was \
                 changed)",
            ));
        }
        state
            .config_mut()
            .set_extension(Arc::new(exec::WriteTo::new(recipe, base)));
        let physical = state.create_physical_plan(&plan).await?;
        let batches = datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        exec::describe(&batches)
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Run one SQL statement and collect its result. Statements read the
    /// dataset and what was registered, nothing else: see [`read_only`].
    pub async fn sql(&self, query: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let plan = parse::logical_plan(&self.ctx.state(), query).await?;
        read_only(&plan)?;
        refuse::wrong_answers(&plan)?;
        // DataFusion turns a refused DROP into "doesn't exist": say why here
        if let LogicalPlan::Ddl(ddl) = &plan {
            let name = match ddl {
                DdlStatement::DropTable(d) => Some(&d.name),
                DdlStatement::DropView(d) => Some(&d.name),
                DdlStatement::CreateMemoryTable(c) => Some(&c.name),
                DdlStatement::CreateView(c) => Some(&c.name),
                _ => None,
            };
            if let Some(name) = name {
                tables::refuse_reserved(name.table())?;
            }
        }
        self.run(plan).await
    }

    /// [`Self::sql`] for a statement whose rows become a population: one
    /// without an ORDER BY of its own has its rows sorted by `cache_id`,
    /// `sample_id` and then every other column (but nested ones), so the
    /// same inputs store the same snapshot and the same draws (a join or a
    /// repartitioned scan returns rows in an order that varies run to run).
    pub async fn sql_population(&self, query: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let plan = parse::logical_plan(&self.ctx.state(), query).await?;
        read_only(&plan)?;
        refuse::wrong_answers(&plan)?;
        let plan = match ordered(&plan) {
            true => plan,
            false => canonical_order(plan)?,
        };
        self.run(plan).await
    }

    /// Run a checked plan to its rows.
    async fn run(&self, plan: LogicalPlan) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let df = self.ctx.execute_logical_plan(plan).await?;
        let task = df.task_ctx();
        let physical = df.create_physical_plan().await?;
        // The schema of the rows as computed: the logical one can differ in
        // nullability from the batches (a query of constants, `SELECT
        // upper('a')`, computes a non-null column the logical plan calls
        // nullable), and one result has one schema.
        let schema = physical.schema();
        let batches = memory::collect(physical, Arc::new(task)).await?;
        let batches = batches
            .into_iter()
            .map(|b| match b.schema() == schema {
                true => Ok(b),
                false => b.with_schema(schema.clone()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok((schema, batches))
    }
}

/// `batch` with each column that holds much more than its rows (a slice of
/// a longer array: memory accounting counts, and the batch keeps, the
/// whole buffers) copied into buffers of its own; string and binary views
/// keep only the bytes they view.
fn compact(batch: &RecordBatch) -> Result<RecordBatch> {
    use arrow::array::{make_array, Array, AsArray, MutableArrayData};
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> Result<ArrayRef> {
            let needed = c.to_data().get_slice_memory_size()?;
            if c.get_array_memory_size() <= 2 * needed + (64 << 10) {
                return Ok(c.clone());
            }
            Ok(match c.data_type() {
                DataType::Utf8View => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView => Arc::new(c.as_binary_view().gc()),
                // (concat of one array returns a slice of it: copy instead)
                _ => {
                    let data = c.to_data();
                    let mut copy = MutableArrayData::new(vec![&data], false, c.len());
                    copy.try_extend(0, 0, c.len())?;
                    make_array(copy.freeze())
                }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Whether a query's rows come in an order it asked for (an ORDER BY at
/// its top, under the projections, aliases and limits above it).
fn ordered(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Sort(_) => true,
        LogicalPlan::Projection(p) => ordered(&p.input),
        LogicalPlan::SubqueryAlias(a) => ordered(&a.input),
        LogicalPlan::Limit(l) => ordered(&l.input),
        _ => false,
    }
}

/// `plan` sorted by `cache_id`, `sample_id`, then its other columns in
/// order (nested types are left out: they have no order), nulls first.
fn canonical_order(plan: LogicalPlan) -> Result<LogicalPlan> {
    use datafusion::logical_expr::{Expr, LogicalPlanBuilder};
    let schema = plan.schema().clone();
    let columns: Vec<_> = schema.columns().into_iter().zip(schema.fields()).collect();
    let identity = ["cache_id", "sample_id"];
    let mut keys = Vec::with_capacity(columns.len());
    for name in identity {
        if let Some((column, _)) = columns.iter().find(|(c, _)| c.name == name) {
            keys.push(Expr::Column(column.clone()).sort(true, true));
        }
    }
    for (column, field) in &columns {
        if !identity.contains(&column.name.as_str()) && !field.data_type().is_nested() {
            keys.push(Expr::Column(column.clone()).sort(true, true));
        }
    }
    if keys.is_empty() {
        return Ok(plan);
    }
    Ok(LogicalPlanBuilder::from(plan).sort(keys)?.build()?)
}
