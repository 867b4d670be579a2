//! Typed records for Python: the engine's format (`datasetrt::store::records`)
//! encoded from and parsed into plain tuples; `datasetrt.records` turns them
//! into numpy dtypes and arrays.

use datasetrt::store::records::{self, FieldAt, Layout, NotALayout};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::IntoPyResult;

/// A field as Python gets it: (name, dtype code, shape, offset, length).
pub type FieldTuple = (String, String, Vec<u64>, u64, u64);

pub fn fields(layout: Layout) -> Vec<FieldTuple> {
    let tuple = |f: FieldAt| (f.name, f.dtype, f.shape, f.offset, f.len);
    layout.fields.into_iter().map(tuple).collect()
}

/// A layout for Python, or its failure: `None` for a payload that is not a
/// typed record, `InvalidInputError` naming what is wrong with a damaged
/// header (Python makes it a `CorruptCacheError` naming the record).
pub fn layout_or_none(
    parsed: Result<Layout, NotALayout>,
) -> PyResult<Option<(usize, Vec<FieldTuple>)>> {
    match parsed {
        Ok(layout) => Ok(Some((layout.header_len, fields(layout)))),
        Err(NotALayout::NotTyped) => Ok(None),
        Err(NotALayout::Damaged(why)) => Err(crate::error::invalid(why)),
    }
}

/// One typed record's bytes from its fields: (name, dtype code, shape,
/// C-order bytes) each.
#[pyfunction]
pub fn encode_record<'py>(
    py: Python<'py>,
    fields: Vec<(String, String, Vec<u64>, Bound<'py, PyBytes>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    let borrowed: Vec<(&str, &str, &[u64], &[u8])> = fields
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.as_slice(), b.as_bytes()))
        .collect();
    let record = records::encode(&borrowed).py()?;
    Ok(PyBytes::new(py, &record))
}

/// The layout of a typed record from its first bytes (its header at least)
/// and its length: (header length, fields), or `None` for bytes that are
/// not a typed record.
#[pyfunction]
pub fn parse_record(head: &[u8], length: u64) -> PyResult<Option<(usize, Vec<FieldTuple>)>> {
    layout_or_none(records::parse(head, length))
}
