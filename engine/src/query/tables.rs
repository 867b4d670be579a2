//! The session's schema of tables, where a table is replaced in one step.
//!
//! DataFusion's own schema refuses to register a name twice, so replacing
//! `metadata` after an update meant deregister + register: a query planned
//! from another thread in between failed with "table not found". Here a
//! replacement swaps the map entry under a lock; a query keeps the table it
//! looked up, so it plans and scans one snapshot from start to end.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};

use crate::Unpoison;

#[derive(Debug, Default)]
pub struct Tables {
    tables: RwLock<HashMap<String, Arc<dyn TableProvider>>>,
}

impl Tables {
    /// Put `table` under `name`, replacing any table of that name at once;
    /// returns the one replaced.
    pub fn replace(
        &self,
        name: &str,
        table: Arc<dyn TableProvider>,
    ) -> Option<Arc<dyn TableProvider>> {
        self.tables
            .write()
            .unpoisoned()
            .insert(name.to_string(), table)
    }

    fn get(&self, name: &str) -> Option<Arc<dyn TableProvider>> {
        self.tables.read().unpoisoned().get(name).cloned()
    }
}

/// `metadata` follows the dataset's active snapshot and `payloads` its
/// caches: SQL may read them, not drop or replace them.
pub(crate) fn refuse_reserved(name: &str) -> DfResult<()> {
    match name {
        "metadata" => Err(DataFusionError::Plan(
            "table metadata is the active population; change it with select(), \
             apply_sql() or update_metadata(), not CREATE or DROP"
                .into(),
        )),
        "payloads" => Err(DataFusionError::Plan(
            "table payloads is the stored samples; it cannot be created or dropped".into(),
        )),
        "mixture" => Err(DataFusionError::Plan(
            "table mixture is the active population's target shares; change them with \
             set_mixture(), not CREATE or DROP"
                .into(),
        )),
        _ => Ok(()),
    }
}

#[async_trait]
impl SchemaProvider for Tables {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tables.read().unpoisoned().keys().cloned().collect();
        names.sort();
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        Ok(self.get(name))
    }

    /// SQL's `CREATE TABLE` (DataFusion checks `table_exist` first, so an
    /// existing name still needs `OR REPLACE`).
    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        refuse_reserved(&name)?;
        Ok(self.replace(&name, table))
    }

    /// SQL's `DROP TABLE`.
    fn deregister_table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        refuse_reserved(name)?;
        Ok(self.tables.write().unpoisoned().remove(name))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// Table `mixture`: the target share of each group of `mixture` (no rows
/// for a population drawn by its weights alone).
pub(crate) fn mixture_table(
    mixture: Option<&crate::catalog::Mixture>,
) -> crate::Result<(arrow::datatypes::SchemaRef, arrow::array::RecordBatch)> {
    use arrow::array::{Float64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("column", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
        Field::new("share", DataType::Float64, false),
    ]));
    let (columns, values, shares) = match mixture {
        Some(m) => (
            vec![m.column(); m.values().len()],
            m.values().iter().map(String::as_str).collect(),
            (0..m.values().len()).map(|g| m.shares().share(g)).collect(),
        ),
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    let batch = arrow::array::RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(columns)),
            Arc::new(StringArray::from(values)),
            Arc::new(Float64Array::from(shares)),
        ],
    )?;
    Ok((schema, batch))
}
