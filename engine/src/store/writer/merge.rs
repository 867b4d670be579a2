//! One source written in parts by several processes, joined into its one
//! cache: shards moved (renamed and renumbered), index and attributes
//! written anew.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema};

use super::publish::{new_manifest, publish, write_attributes, write_index};
use crate::store::codec::Codec;
use crate::store::format::{encode_shard_header, shard_file_name};
use crate::store::fs::temp_sibling;
use crate::store::manifest::Manifest;
use crate::store::validate_source_name;
use crate::{Error, Result};

/// Publish the caches `parts` (published cache directories written with
/// one codec: one source cut into parts, each written by its own process)
/// as the one cache `name` under `root`, their records in order, part after
/// part: the cache one writer would have written from the whole source.
/// Shards are moved, not copied (renamed into the new cache, their header
/// renumbered); the index and attributes are written anew. A metadata
/// column that is all null in some parts takes its type from the others;
/// parts whose columns differ otherwise are invalid input. The parts'
/// directories are gone afterwards, whether the merge succeeded or not.
pub fn merge_parts(root: &Path, name: &str, parts: &[PathBuf]) -> Result<(Manifest, PathBuf)> {
    let merged = merge_into_staging(root, name, parts);
    for part in parts {
        let _ = fs::remove_dir_all(part);
    }
    let (staging, manifest) = merged?;
    publish(root, &staging, manifest).inspect_err(|_| {
        let _ = fs::remove_dir_all(&staging);
    })
}

/// The parts of [`merge_parts`] as one cache in a staging directory of
/// `root`, and its manifest.
fn merge_into_staging(root: &Path, name: &str, parts: &[PathBuf]) -> Result<(PathBuf, Manifest)> {
    validate_source_name(name)?;
    if root.join(name).exists() {
        return Err(Error::invalid(format!(
            "a cache named {name:?} already exists at {}",
            root.join(name).display()
        )));
    }
    let (mut entries, mut attributes, mut shards) = (Vec::new(), Vec::new(), Vec::new());
    let mut codec = None;
    for part in parts {
        let cache = crate::store::Cache::open(part)?;
        let manifest = cache.manifest();
        if *codec.get_or_insert(manifest.codec) != manifest.codec {
            return Err(Error::invalid(format!(
                "the parts of {name:?} were written with two codecs"
            )));
        }
        let base = u32::try_from(shards.len())
            .map_err(|_| Error::invalid(format!("the parts of {name:?} hold too many shards")))?;
        for s in 0..cache.records() {
            let mut entry = cache.entry(s)?;
            entry.shard += base;
            entries.push(entry);
        }
        let stored = cache.attributes()?;
        attributes.push(stored.project(&(1..stored.num_columns()).collect::<Vec<_>>())?);
        for (s, &bytes) in manifest.shard_bytes.iter().enumerate() {
            shards.push((part.join(shard_file_name(s as u32)), bytes));
        }
    }
    let attributes = concat_parts(name, &attributes)?;
    let staging = temp_sibling(&root.join(format!("staging-{name}")));
    fs::create_dir(&staging).map_err(Error::io(&staging))?;
    let written = (|| {
        for (n, (file, _)) in shards.iter().enumerate() {
            let to = staging.join(shard_file_name(n as u32));
            fs::rename(file, &to).map_err(Error::io(&to))?;
            let shard = fs::OpenOptions::new()
                .write(true)
                .open(&to)
                .map_err(Error::io(&to))?;
            std::os::unix::fs::FileExt::write_all_at(&shard, &encode_shard_header(n as u32), 0)
                .and_then(|()| shard.sync_all())
                .map_err(Error::io(&to))?;
        }
        let index_crc32c = write_index(&staging, &entries)?;
        let written = write_attributes(&staging, entries.len() as u64, &attributes)?;
        Ok::<_, Error>((index_crc32c, written))
    })();
    let (index_crc32c, written) = written.inspect_err(|_| {
        let _ = fs::remove_dir_all(&staging);
    })?;
    let manifest = new_manifest(
        name,
        entries.len() as u64,
        codec.unwrap_or(Codec::None),
        shards.iter().map(|&(_, bytes)| bytes).collect(),
        index_crc32c,
        &written,
    );
    Ok((staging, manifest))
}

/// The parts' attributes (without `sample_id`) as one batch: a column that
/// is all null (type Null) in a part takes the type the other parts give it.
fn concat_parts(name: &str, parts: &[RecordBatch]) -> Result<RecordBatch> {
    let Some(first) = parts.first() else {
        return Ok(RecordBatch::new_empty(Arc::new(Schema::empty())));
    };
    let names: Vec<&String> = first
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name())
        .collect();
    if parts.iter().any(|p| p.num_columns() != names.len()) {
        return Err(Error::invalid(format!(
            "the parts of {name:?} have other metadata columns"
        )));
    }
    let mut fields = Vec::with_capacity(names.len());
    for (i, column) in names.iter().enumerate() {
        let mut kind = DataType::Null;
        for part in parts {
            let field = part
                .schema_ref()
                .fields()
                .get(i)
                .filter(|f| f.name() == *column);
            let Some(field) = field else {
                return Err(Error::invalid(format!(
                    "the parts of {name:?} have other metadata columns"
                )));
            };
            match (&kind, field.data_type()) {
                (_, DataType::Null) => {}
                (DataType::Null, other) => kind = other.clone(),
                (a, b) if a == b => {}
                (a, b) => {
                    return Err(Error::invalid(format!(
                        "metadata column {column:?} of {name:?} is {a} in one part and {b} in \
                         another"
                    )))
                }
            }
        }
        fields.push(Field::new(column.as_str(), kind, true));
    }
    let schema = Arc::new(Schema::new(fields));
    let mut batches = Vec::with_capacity(parts.len());
    for part in parts {
        let columns = part
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| match c.data_type() {
                DataType::Null => arrow::array::new_null_array(f.data_type(), c.len()),
                _ => c.clone(),
            })
            .collect();
        batches.push(RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(part.num_rows())),
        )?);
    }
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{new_null_array, ArrayRef, Int64Array};

    fn part(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn a_column_all_null_in_one_part_takes_the_type_of_the_others() {
        let nulls = new_null_array(&DataType::Null, 2);
        let a = part(vec![("label", nulls)]);
        let b = part(vec![(
            "label",
            Arc::new(Int64Array::from(vec![7])) as ArrayRef,
        )]);
        let merged = concat_parts("s", &[a, b]).unwrap();
        assert_eq!(merged.schema().field(0).data_type(), &DataType::Int64);
        let label = merged
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(label.iter().collect::<Vec<_>>(), vec![None, None, Some(7)]);
    }

    #[test]
    fn parts_whose_columns_differ_are_invalid_input() {
        let ints = Arc::new(Int64Array::from(vec![1])) as ArrayRef;
        let text = Arc::new(arrow::array::StringArray::from(vec!["x"])) as ArrayRef;
        let typed = concat_parts(
            "s",
            &[part(vec![("a", ints.clone())]), part(vec![("a", text)])],
        );
        assert!(
            matches!(typed, Err(Error::InvalidInput { .. })),
            "{typed:?}"
        );
        let named = concat_parts(
            "s",
            &[part(vec![("a", ints.clone())]), part(vec![("b", ints)])],
        );
        assert!(
            matches!(named, Err(Error::InvalidInput { .. })),
            "{named:?}"
        );
    }
}
