//! A dataset's first snapshot, assembled from the partitions of its caches.
//!
//! Snapshot 0 of a set of caches is every stored sample of every cache with
//! weight 1.0. Its partitions never span a group boundary: caches, in
//! `cache_id` order, are gathered into **groups** of at most a partition's
//! rows (a larger cache is a group of its own, cut into partitions), and a
//! group ends after a cache that its id's hash chooses, with a chance that
//! grows with the cache's records (a content-defined cut). So a group's
//! partitions depend on its own caches only, and adding or removing a
//! cache changes its own group and at most the few after it, up to the next
//! chosen end, never the rest.
//!
//! Each group's partitions are recorded once written
//! (`<snapshots>/parts/<key>.parts`: which snapshot directory holds their
//! column files, and every column line). The next set of caches that holds
//! the same group (a root that gained a source, a subset opened by path)
//! links those files into its own snapshot directory (hard links: no byte
//! is read or written) instead of building them again. A record that is
//! missing, damaged or names files that are gone is ignored: the group is
//! built from its caches, as it always can be. A linked file is not read:
//! one damaged in the set it came from is damaged in the new set too, found
//! by the chunk checks of the reads that use it (an error naming it, never
//! wrong rows).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::snapshot::{
    column_hash, compact_variable, ensure_sidecar, escape, partition_line, store_columns, unescape,
    write_partition, ColumnEntry, Known, PartitionEntry, Partitioned, COLUMNS_DIR, PARTITION_LINES,
};
use crate::store::checksum::{open_sealed_text, seal_text};
use crate::store::chunks::ChunkTable;
use crate::store::{fs, Cache};
use crate::{Error, Result};

/// Directory of group records, beside the snapshot directories.
pub const PARTS_DIR: &str = "parts";
const HEADER: &str = "datasetrt-parts";
const VERSION: u32 = 1;

/// Caches given as `(cache_id, records)`, sorted by id, grouped as the
/// module says: a group ends before a cache that would take it past `per`
/// rows or that has `per / 2` records or more (such a cache is a group of
/// its own in every set: see [`prepare`]), and after a cache its id
/// chooses (always one of `per / 2` records or more).
pub fn groups(caches: &[(i64, u64)], per: usize) -> Vec<Range<usize>> {
    let per = per.max(1) as u128;
    let mut out = Vec::new();
    let (mut start, mut rows) = (0, 0u128);
    for (i, &(id, records)) in caches.iter().enumerate() {
        let n = records as u128;
        if i > start && (rows + n > per || 2 * n >= per) {
            out.push(start..i);
            (start, rows) = (i, 0);
        }
        rows += n;
        // chosen with probability min(1, 2 n / per), from the id alone
        let h = xxh3_64(&id.to_le_bytes()) as u128;
        if 2 * n >= per || h * per < (2 * n) << 64 {
            out.push(start..i + 1);
            (start, rows) = (i + 1, 0);
        }
    }
    if start < caches.len() {
        out.push(start..caches.len());
    }
    out
}

/// Store the column files of snapshot 0 of `caches` in snapshot directory
/// `dir` (linking the groups recorded beside it, building the others) and
/// return its partitions as its manifest will name them.
pub fn first_population(
    dir: &Path,
    caches: &[Arc<Cache>],
    per: usize,
) -> Result<Vec<PartitionEntry>> {
    let per = per.max(1);
    let records_dir = dir.parent().unwrap_or(dir).join(PARTS_DIR);
    let sizes: Vec<(i64, u64)> = caches.iter().map(|c| (c.id(), c.records())).collect();
    let groups = groups(&sizes, per);
    let keys: Vec<String> = groups
        .iter()
        .map(|g| key(&caches[g.clone()], per))
        .collect();
    let mut records: Vec<Option<Record>> = groups
        .iter()
        .zip(&keys)
        .map(|(g, k)| Record::load(&records_dir, k, &caches[g.clone()]))
        .collect();
    // every cache's own columns: from its group's record, else its attributes
    let mut own: Vec<Vec<Field>> = Vec::with_capacity(caches.len());
    for (g, record) in groups.iter().zip(&records) {
        match record {
            Some(r) => own.extend(r.own.iter().cloned()),
            None => {
                for cache in &caches[g.clone()] {
                    own.push(own_fields(cache)?);
                }
            }
        }
    }
    let schema = union_schema(caches, &own)?;
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::fs::create_dir_all(dir.join(COLUMNS_DIR)).map_err(Error::io(dir))?;
    let mut known = Known::default();
    let mut partitions = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let members = &caches[g.clone()];
        let linked = match records[i].take() {
            Some(record) => record.link(dir, &schema, &mut known)?,
            None => None,
        };
        let parts = match linked {
            Some(parts) => parts,
            None => build_group(dir, &schema, members, per, &mut known)?,
        };
        let record = Record {
            dir: dir_name.clone(),
            own: own[g.clone()].to_vec(),
            schema: schema.clone(),
            partitions: parts,
        };
        // best effort: without it the next set builds this group again
        let _ = record.save(&records_dir, &keys[i], members);
        partitions.extend(record.partitions);
    }
    Ok(partitions)
}

/// For a cache of `per / 2` records or more (a group of its own in every
/// set of caches that holds it), store its partitions as snapshot 0 of any
/// such set would, and their record, beside the snapshot directories in
/// `base` (`parts/columns/`, `parts/<key>.parts`): the first `open` of a
/// set then links them instead of writing them. Called by the process that
/// built the cache, so that caches built in parallel are partitioned in
/// parallel. `false` for a smaller cache (its group depends on the caches
/// beside it); nothing is written again for a cache prepared before.
pub fn prepare(base: &Path, cache: &Arc<Cache>, per: usize) -> Result<bool> {
    let per = per.max(1);
    if 2 * cache.records() < per as u64 {
        return Ok(false);
    }
    let records_dir = base.join(PARTS_DIR);
    let members = std::slice::from_ref(cache);
    let key = key(members, per);
    if Record::load(&records_dir, &key, members).is_some() {
        return Ok(true);
    }
    let own = vec![own_fields(cache)?];
    let schema = union_schema(members, &own)?;
    std::fs::create_dir_all(records_dir.join(COLUMNS_DIR)).map_err(Error::io(&records_dir))?;
    // not recorded as checked: the first open's link gives the files a new
    // version (their change time), which its readers check once
    let mut known = Known::default();
    known.unrecorded = true;
    let partitions = build_group(&records_dir, &schema, members, per, &mut known)?;
    let record = Record {
        dir: PARTS_DIR.to_string(),
        own,
        schema,
        partitions,
    };
    record.save(&records_dir, &key, members)?;
    Ok(true)
}

/// Remove the column files `prepare` stored under `base` that no snapshot
/// directory links any more (one link left: their own), with their chunk
/// tables; returns their names. A set that would have linked one builds it
/// again.
pub fn remove_unlinked(base: &Path) -> Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let columns = base.join(PARTS_DIR).join(COLUMNS_DIR);
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(&columns) else {
        return Ok(removed);
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(&columns))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".arrow") {
            continue;
        }
        let path = entry.path();
        if std::fs::metadata(&path).map_err(Error::io(&path))?.nlink() == 1 {
            std::fs::remove_file(&path).map_err(Error::io(&path))?;
            let _ = std::fs::remove_file(ChunkTable::sidecar(&path));
            removed.push(name);
        }
    }
    Ok(removed)
}

/// Name of a group's record: its caches (id, records and the checksums of
/// their index and attributes, which name their content) and the rows per
/// partition.
fn key(members: &[Arc<Cache>], per: usize) -> String {
    let mut h = Xxh3::new();
    h.update(&VERSION.to_le_bytes());
    h.update(&(per as u64).to_le_bytes());
    for cache in members {
        let m = cache.manifest();
        h.update(&m.cache_id.to_le_bytes());
        h.update(&m.records.to_le_bytes());
        h.update(&m.attributes_bytes.to_le_bytes());
        h.update(&m.attributes_crc32c.to_le_bytes());
        h.update(&m.index_crc32c.to_le_bytes());
    }
    format!("{:032x}", h.digest128())
}

/// A cache's own metadata columns: its attributes' fields after `sample_id`.
fn own_fields(cache: &Cache) -> Result<Vec<Field>> {
    let schema = cache.attributes()?.schema();
    Ok(schema
        .fields()
        .iter()
        .skip(1)
        .map(|f| f.as_ref().clone())
        .collect())
}

/// `cache_id`, `sample_id`, every cache's own columns (nullable, in order of
/// first appearance) and `weight`; a column with two types in two caches is
/// an error naming both.
fn union_schema(caches: &[Arc<Cache>], own: &[Vec<Field>]) -> Result<SchemaRef> {
    let mut columns: Vec<(Field, &str)> = Vec::new();
    for (cache, fields) in caches.iter().zip(own) {
        for field in fields {
            match columns.iter().find(|(f, _)| f.name() == field.name()) {
                Some((seen, owner)) if seen.data_type() != field.data_type() => {
                    return Err(Error::invalid(format!(
                        "metadata column {:?} is {} in cache {owner:?} but {} in cache {:?}",
                        field.name(),
                        seen.data_type(),
                        field.data_type(),
                        cache.name()
                    )))
                }
                Some(_) => {}
                None => columns.push((field.clone().with_nullable(true), cache.name())),
            }
        }
    }
    let mut fields = vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
    ];
    fields.extend(columns.into_iter().map(|(f, _)| f));
    fields.push(Field::new("weight", DataType::Float64, false));
    Ok(Arc::new(Schema::new(fields)))
}

/// Rows `at..at + take` of `cache` as rows of `schema`: its id, its
/// attributes (null where it has no such column) and weight 1.0.
fn cache_rows(schema: &SchemaRef, cache: &Cache, at: usize, take: usize) -> Result<RecordBatch> {
    let attrs = cache.attributes()?.slice(at, take);
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields().iter() {
        arrays.push(match field.name().as_str() {
            "cache_id" => Arc::new(Int64Array::from(vec![cache.id(); take])),
            "sample_id" => attrs.column(0).clone(),
            "weight" => Arc::new(Float64Array::from(vec![1.0; take])),
            name => match attrs.column_by_name(name) {
                Some(col) => col.clone(),
                None => new_null_array(field.data_type(), take),
            },
        });
    }
    let rows = RecordBatch::try_new(schema.clone(), arrays)?;
    // a batch as given is hashed and stored whole: a slice of the cache's
    // arrays gets its own copy of any that are not fixed-width
    match take == cache.records() as usize {
        true => Ok(rows),
        false => compact_variable(&rows),
    }
}

/// Build and store the partitions of one group from its caches, a window
/// of partitions (one per engine thread, at most 4) at a time, so that
/// what is held in memory is a few partitions' `cache_id` and `weight`
/// columns.
fn build_group(
    dir: &Path,
    schema: &SchemaRef,
    members: &[Arc<Cache>],
    per: usize,
    known: &mut Known,
) -> Result<Vec<PartitionEntry>> {
    // a multiple of `per`: a window's cut is the group's cut
    let window = per.saturating_mul(crate::threads().clamp(1, 4));
    let mut out = Vec::new();
    let mut pending: Vec<RecordBatch> = Vec::new();
    let mut pending_rows = 0;
    let mut flush = |pending: &mut Vec<RecordBatch>, out: &mut Vec<PartitionEntry>| -> Result<()> {
        // each partition is stored as soon as it is cut and hashed (nothing
        // here is checked before anything is written, as an update is)
        Partitioned::new(schema, pending, per, None, |_, batch, hashes| {
            out.push(super::snapshot::store_partition(dir, batch, hashes, known)?);
            Ok(())
        })?;
        pending.clear();
        Ok(())
    };
    for cache in members {
        let n = cache.records() as usize;
        let mut at = 0;
        while at < n {
            let take = (window - pending_rows).min(n - at);
            pending.push(cache_rows(schema, cache, at, take)?);
            pending_rows += take;
            at += take;
            if pending_rows == window {
                flush(&mut pending, &mut out)?;
                pending_rows = 0;
            }
        }
    }
    if pending_rows > 0 {
        flush(&mut pending, &mut out)?;
    }
    Ok(out)
}

/// What a group's record says: where its files are, its caches' own
/// columns, the schema its partitions were written with, and their lines.
struct Record {
    /// Name of the snapshot directory (beside the records) holding the files.
    dir: String,
    own: Vec<Vec<Field>>,
    schema: SchemaRef,
    partitions: Vec<PartitionEntry>,
}

fn field_line(key: &str, field: &Field) -> String {
    let kind = if field.is_nullable() {
        "null"
    } else {
        "required"
    };
    format!(
        "{key}={kind}\t{}\t{}",
        escape(&field.data_type().to_string()),
        escape(field.name())
    )
}

/// A field from `field_line`'s value; `None` unless its type reads back as
/// written.
fn parse_field(value: &str) -> Option<Field> {
    let mut parts = value.splitn(3, '\t');
    let nullable = match parts.next()? {
        "null" => true,
        "required" => false,
        _ => return None,
    };
    let text = unescape(parts.next()?)?;
    let data_type = DataType::from_str(&text).ok()?;
    (data_type.to_string() == text).then_some(())?;
    Some(Field::new(unescape(parts.next()?)?, data_type, nullable))
}

impl Record {
    fn path(records_dir: &Path, key: &str) -> PathBuf {
        records_dir.join(format!("{key}.parts"))
    }

    fn save(&self, records_dir: &Path, key: &str, members: &[Arc<Cache>]) -> Result<()> {
        let mut body = format!("{HEADER} {VERSION}\ndir={}\n", escape(&self.dir));
        for (cache, fields) in members.iter().zip(&self.own) {
            body.push_str(&format!("cache={}\n", cache.id()));
            for field in fields {
                body.push_str(&field_line("own", field));
                body.push('\n');
            }
        }
        for field in self.schema.fields().iter() {
            body.push_str(&field_line("field", field));
            body.push('\n');
        }
        for part in &self.partitions {
            write_partition(&mut body, part);
        }
        std::fs::create_dir_all(records_dir).map_err(Error::io(records_dir))?;
        // sealed: a record a crash left torn is not read, and its group is
        // built again (so no fsync: a new set rewrites every record)
        fs::write_derived(&Self::path(records_dir, key), seal_text(&body).as_bytes())
    }

    /// The record of group `key`, if there is one that reads whole and
    /// describes `members`.
    fn load(records_dir: &Path, key: &str, members: &[Arc<Cache>]) -> Option<Record> {
        let path = Self::path(records_dir, key);
        let raw = std::fs::read(&path).ok()?;
        let (_, body) =
            open_sealed_text(&path, &raw, HEADER, VERSION..=VERSION, "group record").ok()?;
        let mut record = Record {
            dir: String::new(),
            own: Vec::new(),
            schema: Arc::new(Schema::empty()),
            partitions: Vec::new(),
        };
        let mut ids = Vec::new();
        let mut fields = Vec::new();
        for line in body.lines().skip(1) {
            let (key, value) = line.split_once('=')?;
            match key {
                "dir" => record.dir = unescape(value)?,
                "cache" => {
                    ids.push(value.parse::<i64>().ok()?);
                    record.own.push(Vec::new());
                }
                "own" => record.own.last_mut()?.push(parse_field(value)?),
                "field" => fields.push(parse_field(value)?),
                _ => partition_line(key, value, PARTITION_LINES, &mut record.partitions).ok()?,
            }
        }
        record.schema = Arc::new(Schema::new(fields));
        let names: Vec<&str> = record
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let whole = ids == members.iter().map(|c| c.id()).collect::<Vec<_>>()
            && !record.dir.is_empty()
            && !record.dir.contains(['/', '\\'])
            && record.dir != ".."
            && record.partitions.iter().all(|p| {
                p.mass.is_some()
                    && p.columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .eq(names.iter().copied())
            })
            && record.partitions.iter().map(|p| p.rows as u64).sum::<u64>()
                == members.iter().map(|c| c.records()).sum::<u64>();
        whole.then_some(record)
    }

    /// Link this group's column files into snapshot directory `dir`, as
    /// columns of `schema`: a column the record has with the same type is
    /// linked, any other (a metadata column none of the group's caches has,
    /// new in this set) is stored as nulls. `None` when a file is gone or
    /// does not match the record.
    fn link(
        self,
        dir: &Path,
        schema: &SchemaRef,
        known: &mut Known,
    ) -> Result<Option<Vec<PartitionEntry>>> {
        let from = dir
            .parent()
            .unwrap_or(dir)
            .join(&self.dir)
            .join(COLUMNS_DIR);
        let to = dir.join(COLUMNS_DIR);
        let mut out = Vec::with_capacity(self.partitions.len());
        for part in &self.partitions {
            let mut columns = Vec::with_capacity(schema.fields().len());
            for field in schema.fields().iter() {
                let recorded = self
                    .schema
                    .field_with_name(field.name())
                    .ok()
                    .filter(|f| {
                        f.data_type() == field.data_type() && f.is_nullable() == field.is_nullable()
                    })
                    .and_then(|_| part.columns.iter().find(|c| c.name == *field.name()));
                let owned = self.own.iter().flatten().any(|f| f.name() == field.name());
                // files linked before a failure stay: named by content, they
                // are right for any snapshot that names them (another
                // process's, say), and `cleanup` removes unused ones
                let column = match recorded.map(|c| (c, link_file(&from, &to, c))) {
                    Some((c, Some(()))) => c.clone(),
                    // a metadata column none of the group's caches has: nulls
                    None if field.is_nullable() && !owned => {
                        null_column(dir, field, part.rows, known)?
                    }
                    _ => return Ok(None),
                };
                columns.push(column);
            }
            out.push(PartitionEntry {
                rows: part.rows,
                mass: part.mass,
                columns,
            });
        }
        known.add(&out);
        Ok(Some(out))
    }
}

/// Link column file `c` (and its chunk table) from `from` into `to` unless
/// `to` has it (another group or process linked or wrote it: the same
/// content); `None` if it is in neither or does not match `c`'s length and
/// checksum. The file's bytes are not read: a damaged one is linked as it
/// is and found by the chunk checks of the reads that use it, as in the set
/// it came from.
fn link_file(from: &Path, to: &Path, c: &ColumnEntry) -> Option<()> {
    let (crc, len) = (c.crc?, c.len?);
    let name = format!("{}.arrow", c.hash);
    let target = to.join(&name);
    let source = from.join(&name);
    match std::fs::hard_link(&source, &target) {
        Ok(()) => {
            let _ = std::fs::hard_link(ChunkTable::sidecar(&source), ChunkTable::sidecar(&target));
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    // the chunk table bound to the record's length and checksum (made from
    // the file if it has none; a file that does not match is not taken)
    ensure_sidecar(&target, len, crc).ok()
}

/// A column of `rows` nulls of `field`'s type, stored under `dir`.
fn null_column(dir: &Path, field: &Field, rows: usize, known: &mut Known) -> Result<ColumnEntry> {
    let array = new_null_array(field.data_type(), rows);
    let hash = column_hash(field, &array);
    let schema = Arc::new(Schema::new(vec![field.clone()]));
    let batch = RecordBatch::try_new(schema, vec![array])?;
    let (hash, crc, len) = store_columns(dir, &batch, &[hash], known.checksums(), true)?
        .pop()
        .expect("one column");
    Ok(ColumnEntry {
        hash,
        name: field.name().clone(),
        crc: Some(crc),
        len: Some(len),
        range: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` caches of random ids (from `seed`) and up to `most` records.
    fn caches(seed: u64, n: usize, most: u64) -> Vec<(i64, u64)> {
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut out: Vec<(i64, u64)> = (0..n)
            .map(|_| ((next() >> 11) as i64, next() % (most + 1)))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn groups_hold_at_most_a_partition_unless_one_large_cache() {
        for seed in 1..50 {
            let set = caches(seed, 200, 3_000);
            let cut = groups(&set, 4_096);
            assert_eq!(cut.first().map(|g| g.start), Some(0));
            assert_eq!(cut.last().map(|g| g.end), Some(set.len()));
            assert!(cut.windows(2).all(|w| w[0].end == w[1].start));
            for g in &cut {
                let rows: u64 = set[g.clone()].iter().map(|c| c.1).sum();
                assert!(rows <= 4_096 || g.len() == 1, "{g:?}: {rows} rows");
                // a cache of half a partition or more is a group of its own
                if g.len() > 1 {
                    for cache in &set[g.clone()] {
                        assert!(2 * cache.1 < 4_096, "{cache:?} in {g:?}");
                    }
                }
            }
            // several caches share groups: small caches are gathered
            assert!(cut.iter().any(|g| g.len() > 1), "seed {seed}");
        }
    }

    #[test]
    fn a_cache_added_changes_only_the_groups_up_to_the_next_chosen_end() {
        for seed in 1..200 {
            let mut set = caches(seed, 60, 1_000);
            let before = groups(&set, 4_096);
            let added = caches(seed + 1_000, 1, 1_000)[0];
            let at = set.partition_point(|c| c < &added);
            set.insert(at, added);
            let after = groups(&set, 4_096);
            // as sets of caches: the groups that do not hold the new cache
            let members = |cut: &[Range<usize>], set: &[(i64, u64)]| -> Vec<Vec<i64>> {
                cut.iter()
                    .map(|g| set[g.clone()].iter().map(|c| c.0).collect())
                    .collect()
            };
            let old = members(
                &before,
                &set.iter()
                    .filter(|c| **c != added)
                    .copied()
                    .collect::<Vec<_>>(),
            );
            let new = members(&after, &set);
            let kept = new.iter().filter(|g| old.contains(g)).count();
            // the new cache's group differs; so may those after it up to the
            // next cache chosen by its id: on average few, never all
            assert!(
                kept + 6 >= new.len(),
                "seed {seed}: {kept} of {} kept",
                new.len()
            );
            // every group before the new cache's is as it was
            let first = after.iter().position(|g| g.contains(&at)).unwrap();
            assert_eq!(new[..first], old[..first], "seed {seed}");
        }
    }
}
