//! The manifest: a snapshot's one text file (`NNNNNNNN.snapshot`), sealed
//! by a checksum, naming its rows, note, parent, mixture and, partition by
//! partition, each column file (hash, CRC-32C, length, name, range).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::Xxh3;

use super::escape::{escape, unescape};
use super::mixture::{Mixture, MixtureLines};
use crate::catalog::ranges::ColumnRange;
use crate::store::checksum::{open_sealed_text, seal_text};
use crate::store::fs;
use crate::{Error, Result};

const HEADER: &str = "datasetrt-snapshot";

/// Rows of a partition are u32 (its alias table's entries): at most
/// 2^32 - 1 of them. A population has any number of partitions.
pub const MAX_PARTITION_ROWS: usize = u32::MAX as usize;

/// The file name of snapshot `number`'s manifest.
pub fn file_name(number: u64) -> String {
    format!("{number:08}.snapshot")
}
/// Version 2 adds per-column checksums and lengths, `parent`, and escaping;
/// version 3 partitions (`partition=<rows>` before each partition's columns);
/// version 4 each partition's weight mass (`partition=<rows> <mass>`), so
/// that weighted draws pick a partition before reading any of its weights;
/// version 5 a mixture (`mixture=` and `group=` lines), written only by a
/// snapshot that has one, so that a build that would draw without it
/// refuses the snapshot.
const VERSION: u32 = 5;
/// The version of a manifest without a mixture.
const VERSION_PLAIN: u32 = 4;

/// A column file as a manifest names it: content hash, and (from version 2)
/// the CRC-32C and length of the whole file, checked before it is used.
#[derive(Debug, Clone)]
pub struct ColumnEntry {
    pub hash: String,
    pub name: String,
    pub crc: Option<u32>,
    pub len: Option<u64>,
    /// Its least and greatest value (a `range=` line after the column's:
    /// numeric columns written since ranges were recorded).
    pub range: Option<ColumnRange>,
}

/// One partition as a manifest names it: its rows, weight mass and column
/// files.
#[derive(Debug, Clone)]
pub struct PartitionEntry {
    pub rows: usize,
    /// The sum of its weights in row order ([`crate::sample::mass`]); `None`
    /// before version 4 (then summed from the weights when first needed).
    pub mass: Option<f64>,
    pub columns: Vec<ColumnEntry>,
}

/// A parsed, checksum-verified snapshot manifest.
#[derive(Debug, Clone)]
pub struct SnapshotManifest {
    pub rows: usize,
    pub created_unix_ms: u64,
    /// The head this snapshot was committed on (`None` for the first one and
    /// for version-1 manifests, written before heads existed).
    pub parent: Option<u64>,
    pub note: String,
    pub fingerprint: String,
    /// At least one; every partition names the same columns in the same
    /// order (versions 1 and 2: one partition of every row).
    pub partitions: Vec<PartitionEntry>,
    /// The manifest's format version (1: columns carry no checksum; 3:
    /// partitions).
    pub version: u32,
    /// Target shares of groups of rows (version 5).
    pub mixture: Option<Mixture>,
}

impl SnapshotManifest {
    /// Every column file entry, partition after partition.
    pub fn columns(&self) -> impl Iterator<Item = &ColumnEntry> {
        self.partitions.iter().flat_map(|p| p.columns.iter())
    }
}

/// xxh3-128 over rows, column names and column contents. One partition
/// gives the fingerprint snapshots had before partitions; several add each
/// partition's rows.
fn fingerprint(rows: usize, names: &[String], partitions: &[(usize, &[String])]) -> String {
    let mut h = Xxh3::new();
    h.update(&(rows as u64).to_le_bytes());
    for (part_rows, hashes) in partitions {
        if partitions.len() > 1 {
            h.update(b"partition");
            h.update(&(*part_rows as u64).to_le_bytes());
        }
        for (name, hash) in names.iter().zip(hashes.iter()) {
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(hash.as_bytes());
        }
    }
    format!("{:032x}", h.digest128())
}

/// Write the manifest of a population of `partitions` (their column files
/// stored) as the first free snapshot number at or above `number` (see
/// `write::publish`).
pub(in crate::catalog) fn write_manifest(
    dir: &Path,
    partitions: &[PartitionEntry],
    number: u64,
    note: &str,
    parent: Option<u64>,
    mixture: Option<&Mixture>,
) -> Result<u64> {
    let rows: usize = partitions.iter().map(|p| p.rows).sum();
    let names: Vec<String> = partitions
        .first()
        .map(|p| p.columns.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let hashes: Vec<Vec<String>> = partitions
        .iter()
        .map(|p| p.columns.iter().map(|c| c.hash.clone()).collect())
        .collect();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let version = match mixture {
        Some(_) => VERSION,
        None => VERSION_PLAIN,
    };
    let mut body = format!("{HEADER} {version}\nrows={rows}\ncreated_unix_ms={created}\n");
    match parent {
        Some(p) => {
            let _ = writeln!(body, "parent={p}");
        }
        None => body.push_str("parent=none\n"),
    }
    let _ = writeln!(body, "note={}", escape(note));
    let parts: Vec<(usize, &[String])> = partitions
        .iter()
        .zip(&hashes)
        .map(|(p, h)| (p.rows, h.as_slice()))
        .collect();
    let mut print = fingerprint(rows, &names, &parts);
    if let Some(m) = mixture {
        print = m.fingerprint(&print);
    }
    let _ = writeln!(body, "fingerprint={print}");
    if let Some(m) = mixture {
        m.write_lines(&mut body);
    }
    for part in partitions {
        write_partition(&mut body, part);
    }
    let text = seal_text(&body);

    let tmp = fs::temp_sibling(&dir.join(file_name(number)));
    fs::write_synced(&tmp, text.as_bytes())?;
    let mut n = number;
    loop {
        let path = dir.join(file_name(n));
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(Error::io(&path)(e));
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    fs::sync_dir(dir)?;
    Ok(n)
}

/// The manifest version of the partition lines [`write_partition`] writes
/// (what records of groups and workers' descriptions of what they stored
/// are read as).
pub(in crate::catalog) const PARTITION_LINES: u32 = 4;

/// A partition's lines in a manifest: `partition=<rows> <mass>`, then per
/// column `column=<hash> <crc> <len> <name>` and its `range=` line if any.
pub(in crate::catalog) fn write_partition(body: &mut String, part: &PartitionEntry) {
    let mass = part.mass.unwrap_or(part.rows as f64);
    let _ = writeln!(body, "partition={} {mass:?}", part.rows);
    for c in &part.columns {
        let _ = writeln!(
            body,
            "column={} {:08x} {} {}",
            c.hash,
            c.crc.unwrap_or(0),
            c.len.unwrap_or(0),
            escape(&c.name)
        );
        if let Some(range) = c.range {
            let _ = writeln!(body, "range={}", range.text());
        }
    }
}

/// The names (before the first `.`) of every file of `columns/` snapshot
/// `number` uses: its column files, their chunk tables, and the alias
/// tables of its weight columns (named by the weight column's hash).
pub fn used_names(dir: &Path, number: u64) -> Result<Vec<String>> {
    let manifest = read_manifest(dir, number)?;
    Ok(manifest.columns().map(|c| c.hash.clone()).collect())
}

/// The column hashes a snapshot manifest names (checksum verified), each
/// once (partitions may share a file).
pub fn manifest_columns(dir: &Path, number: u64) -> Result<Vec<String>> {
    let mut seen = HashSet::new();
    Ok(read_manifest(dir, number)?
        .columns()
        .filter(|c| seen.insert(c.hash.as_str()))
        .map(|c| c.hash.clone())
        .collect())
}

/// Read and check the manifest of snapshot `number` in `dir`.
pub fn read_manifest(dir: &Path, number: u64) -> Result<SnapshotManifest> {
    let path = dir.join(file_name(number));
    let raw = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: "metadata snapshot",
            path: path.clone(),
        },
        _ => Error::io(&path)(e),
    })?;
    let bad = |detail: String| Error::corrupt(&path, detail);
    let (version, body) = open_sealed_text(&path, &raw, HEADER, 1..=VERSION, "snapshot manifest")?;
    let mut manifest = SnapshotManifest {
        rows: 0,
        created_unix_ms: 0,
        parent: None,
        note: String::new(),
        fingerprint: String::new(),
        // before version 3, every column line belongs to the one partition
        partitions: match version {
            1 | 2 => vec![PartitionEntry {
                rows: 0,
                mass: None,
                columns: Vec::new(),
            }],
            _ => Vec::new(),
        },
        version,
        mixture: None,
    };
    let mut rows = None;
    let mut mixture = MixtureLines::default();
    for line in body.lines().skip(1) {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| bad(format!("bad line {line:?}")))?;
        let bad_line = || bad(format!("bad {key} line {line:?}"));
        match key {
            "rows" => rows = value.parse::<usize>().ok(),
            "created_unix_ms" => manifest.created_unix_ms = value.parse().unwrap_or(0),
            "parent" if value == "none" => manifest.parent = None,
            "parent" => manifest.parent = Some(value.parse().map_err(|_| bad_line())?),
            "note" if version == 1 => manifest.note = value.to_string(),
            "note" => manifest.note = unescape(value).ok_or_else(bad_line)?,
            "fingerprint" => manifest.fingerprint = value.to_string(),
            "column" if version == 1 => {
                let (hash, name) = value.split_once(' ').ok_or_else(bad_line)?;
                let last = manifest.partitions.last_mut().ok_or_else(|| {
                    bad(format!("column line {line:?} before any partition line"))
                })?;
                last.columns.push(ColumnEntry {
                    hash: hash.to_string(),
                    name: name.to_string(),
                    crc: None,
                    len: None,
                    range: None,
                });
            }
            "partition" | "column" | "range" => {
                partition_line(key, value, version, &mut manifest.partitions).map_err(bad)?
            }
            "mixture" | "group" if version >= 5 => mixture.line(key, value).map_err(bad)?,
            _ => {}
        }
    }
    manifest.mixture = mixture.finish().map_err(bad)?;
    check_hashes(&manifest).map_err(bad)?;
    manifest.rows = rows.ok_or_else(|| bad("no rows line".into()))?;
    if version < 3 {
        manifest.partitions[0].rows = manifest.rows;
        return Ok(manifest);
    }
    check_partitions(&manifest).map_err(bad)?;
    Ok(manifest)
}

/// Every column hash of `manifest` is 32 hex digits; the error says which is not.
fn check_hashes(manifest: &SnapshotManifest) -> std::result::Result<(), String> {
    match manifest
        .columns()
        .find(|c| c.hash.len() != 32 || !c.hash.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        Some(entry) => Err(format!("column hash {:?} is not 32 hex digits", entry.hash)),
        None => Ok(()),
    }
}

/// The partitions of a manifest of version 3 or later: at least one, each
/// with rows (at most 2^32 - 1) and the first one's columns, adding up to the
/// rows line; the error says what is wrong.
fn check_partitions(manifest: &SnapshotManifest) -> std::result::Result<(), String> {
    let Some(first) = manifest.partitions.first() else {
        return Err("no partition line".into());
    };
    let names = |p: &PartitionEntry| p.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let first_names = names(first);
    for (i, part) in manifest.partitions.iter().enumerate() {
        if part.rows == 0 {
            return Err(format!("partition {i} has no rows"));
        }
        if part.rows > MAX_PARTITION_ROWS {
            return Err(format!(
                "partition {i} has {} rows; a partition holds at most 2^32 - 1",
                part.rows
            ));
        }
        if names(part) != first_names {
            return Err(format!(
                "partition {i} names columns {:?}, partition 0 {first_names:?}",
                names(part)
            ));
        }
    }
    let sum = manifest
        .partitions
        .iter()
        .try_fold(0usize, |sum, p| sum.checked_add(p.rows));
    if sum != Some(manifest.rows) {
        return Err(format!(
            "the partitions' rows do not add up to the rows line's {}",
            manifest.rows
        ));
    }
    Ok(())
}

/// Apply one `partition`, `column` or `range` line (of a manifest of
/// `version` 2 or later, or a group record) to `partitions`; the error is
/// what is wrong with the line.
pub(in crate::catalog) fn partition_line(
    key: &str,
    value: &str,
    version: u32,
    partitions: &mut Vec<PartitionEntry>,
) -> std::result::Result<(), String> {
    let line = format!("{key}={value}");
    let bad_line = || format!("bad {key} line {line:?}");
    match key {
        "partition" if version >= 3 => {
            let (rows, mass) = match value.split_once(' ') {
                Some((rows, mass)) if version >= 4 => (rows, Some(mass)),
                None if version == 3 => (value, None),
                _ => return Err(bad_line()),
            };
            let mass = match mass {
                Some(m) => Some(
                    m.parse::<f64>()
                        .ok()
                        .filter(|m| m.is_finite() && *m >= 0.0)
                        .ok_or_else(bad_line)?,
                ),
                None => None,
            };
            partitions.push(PartitionEntry {
                rows: rows.parse().map_err(|_| bad_line())?,
                mass,
                columns: Vec::new(),
            });
        }
        "column" => {
            let last = partitions
                .last_mut()
                .ok_or_else(|| format!("column line {line:?} before any partition line"))?;
            let mut parts = value.splitn(4, ' ');
            let mut next = || parts.next().ok_or_else(bad_line);
            let (hash, crc, len, name) = (next()?, next()?, next()?, next()?);
            last.columns.push(ColumnEntry {
                hash: hash.to_string(),
                crc: Some(u32::from_str_radix(crc, 16).map_err(|_| bad_line())?),
                len: Some(len.parse().map_err(|_| bad_line())?),
                name: unescape(name).ok_or_else(bad_line)?,
                range: None,
            });
        }
        // the column line before it names the column (builds that do not
        // know ranges skip these lines, as every reader skips unknown keys)
        "range" => {
            let column = partitions
                .last_mut()
                .and_then(|p| p.columns.last_mut())
                .ok_or_else(|| format!("range line {line:?} before any column line"))?;
            column.range = Some(ColumnRange::parse(value).ok_or_else(bad_line)?);
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A column file as a manifest names it (a manifest is written and read
    /// without the files it names).
    fn column(name: &str, seed: u8) -> ColumnEntry {
        ColumnEntry {
            hash: format!("{seed:02x}").repeat(16),
            name: name.to_string(),
            crc: Some(0xdead_0000 | u32::from(seed)),
            len: Some(1_000 + u64::from(seed)),
            range: None,
        }
    }

    /// A partition of `rows` rows and weight `mass`, its three column files
    /// named by `seed`.
    fn partition(rows: usize, mass: f64, seed: u8) -> PartitionEntry {
        PartitionEntry {
            rows,
            mass: Some(mass),
            columns: vec![
                column("cache_id", seed),
                column("sample_id", seed + 1),
                column("weight", seed + 2),
            ],
        }
    }

    #[test]
    fn a_manifest_written_then_read_gives_back_its_partitions_and_columns() {
        let dir = tempfile::tempdir().unwrap();
        let mut parts = vec![partition(4, 6.5, 1), partition(3, 0.0, 7)];
        parts[0].columns[1].range = Some(ColumnRange::Int(-3, 7));
        parts[1].columns[2].range = Some(ColumnRange::Float(0.0, 0.25));
        // partitions share a column file when their values are equal
        parts[1].columns[0].hash = parts[0].columns[0].hash.clone();
        let note = "update\twith a tab,\na newline, 100% and a \\ backslash";
        let n = write_manifest(dir.path(), &parts, 3, note, Some(2), None).unwrap();
        assert_eq!(n, 3);

        let read = read_manifest(dir.path(), n).unwrap();
        assert_eq!(read.rows, 7);
        assert_eq!(read.version, VERSION_PLAIN);
        assert_eq!(read.parent, Some(2));
        assert_eq!(read.note, note);
        assert!(read.mixture.is_none());
        assert!(read.created_unix_ms > 0);
        assert_eq!(read.partitions.len(), parts.len());
        for (got, want) in read.partitions.iter().zip(&parts) {
            assert_eq!((got.rows, got.mass), (want.rows, want.mass));
            assert_eq!(got.columns.len(), want.columns.len());
            for (g, w) in got.columns.iter().zip(&want.columns) {
                assert_eq!(
                    (&g.hash, &g.name, g.crc, g.len, g.range),
                    (&w.hash, &w.name, w.crc, w.len, w.range)
                );
            }
        }
        // every file it uses, and each file once
        assert_eq!(used_names(dir.path(), n).unwrap().len(), 6);
        let columns = manifest_columns(dir.path(), n).unwrap();
        assert_eq!(columns.len(), 5);
        assert!(columns.contains(&parts[1].columns[2].hash));
    }

    #[test]
    fn a_manifest_never_replaces_one_stored_under_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let parts = [partition(2, 2.0, 1)];
        assert_eq!(
            write_manifest(dir.path(), &parts, 0, "first", None, None).unwrap(),
            0
        );
        assert_eq!(
            write_manifest(dir.path(), &parts, 0, "second", Some(0), None).unwrap(),
            1
        );
        assert_eq!(read_manifest(dir.path(), 0).unwrap().note, "first");
        assert_eq!(read_manifest(dir.path(), 1).unwrap().note, "second");
    }

    #[test]
    fn the_fingerprint_follows_the_rows_and_column_files_not_the_note() {
        let dir = tempfile::tempdir().unwrap();
        let parts = [partition(4, 4.0, 1)];
        let mut reweighted = parts.clone();
        reweighted[0].columns[2].hash = "ab".repeat(16);
        let recut = [partition(2, 2.0, 1), partition(2, 2.0, 1)];
        let a = write_manifest(dir.path(), &parts, 0, "one note", None, None).unwrap();
        let b = write_manifest(dir.path(), &parts, 0, "another", Some(a), None).unwrap();
        let c = write_manifest(dir.path(), &reweighted, 0, "one note", None, None).unwrap();
        let d = write_manifest(dir.path(), &recut, 0, "one note", None, None).unwrap();
        let print = |n| read_manifest(dir.path(), n).unwrap().fingerprint;
        assert_eq!(print(a), print(b));
        assert_ne!(print(a), print(c));
        assert_ne!(print(a), print(d));
    }

    #[test]
    fn a_damaged_or_cut_short_manifest_is_refused_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        write_manifest(dir.path(), &[partition(5, 5.0, 1)], 0, "n", None, None).unwrap();
        let path = dir.path().join(file_name(0));
        let good = std::fs::read(&path).unwrap();
        // every byte before the checksum line is sealed by it
        let sealed = good.windows(9).rposition(|w| w == b"checksum=").unwrap();
        for i in 0..sealed {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            let read = read_manifest(dir.path(), 0);
            assert!(
                matches!(read, Err(Error::Corrupt { .. })),
                "flip at byte {i} went unseen: {read:?}"
            );
        }
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        let read = read_manifest(dir.path(), 0);
        assert!(matches!(read, Err(Error::Corrupt { .. })), "{read:?}");
        std::fs::remove_file(&path).unwrap();
        let read = read_manifest(dir.path(), 0);
        assert!(matches!(read, Err(Error::NotFound { .. })), "{read:?}");
    }

    #[test]
    fn a_manifest_of_a_newer_format_is_refused_as_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        let newer = seal_text(&format!("{HEADER} {}\nrows=0\n", VERSION + 1));
        std::fs::write(dir.path().join(file_name(0)), newer).unwrap();
        match read_manifest(dir.path(), 0) {
            Err(Error::UnsupportedVersion {
                found, supported, ..
            }) => assert_eq!((found, supported), (VERSION + 1, VERSION)),
            other => panic!("expected an unsupported version, got {other:?}"),
        }
    }

    #[test]
    fn a_manifest_whose_partitions_disagree_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // a partition without rows
        let empty = [partition(3, 3.0, 1), partition(0, 0.0, 4)];
        // a partition naming other columns than partition 0
        let mut renamed = [partition(3, 3.0, 1), partition(2, 2.0, 4)];
        renamed[1].columns[2].name = "weights".to_string();
        // a column hash that is not 32 hex digits
        let mut short = [partition(3, 3.0, 1)];
        short[0].columns[0].hash.truncate(31);
        for (n, parts) in [&empty[..], &renamed[..], &short[..]]
            .into_iter()
            .enumerate()
        {
            let n = n as u64;
            write_manifest(dir.path(), parts, n, "", None, None).unwrap();
            let read = read_manifest(dir.path(), n);
            assert!(
                matches!(read, Err(Error::Corrupt { .. })),
                "snapshot {n}: {read:?}"
            );
        }
    }

    #[test]
    fn a_partition_written_as_lines_reads_back_through_partition_line() {
        let mut part = partition(9, 4.25, 3);
        part.columns[0].range = Some(ColumnRange::Int(1, 1));
        part.columns[1].name = "odd name\twith a tab = and 100%".to_string();
        let mut body = String::new();
        write_partition(&mut body, &part);
        let mut read = Vec::new();
        for line in body.lines() {
            let (key, value) = line.split_once('=').unwrap();
            partition_line(key, value, PARTITION_LINES, &mut read).unwrap();
        }
        assert_eq!(read.len(), 1);
        assert_eq!((read[0].rows, read[0].mass), (9, Some(4.25)));
        assert_eq!(read[0].columns.len(), part.columns.len());
        for (g, w) in read[0].columns.iter().zip(&part.columns) {
            assert_eq!(
                (&g.hash, &g.name, g.crc, g.len, g.range),
                (&w.hash, &w.name, w.crc, w.len, w.range)
            );
        }
        // a column line belongs to the partition line before it
        let (key, value) = body.lines().nth(1).unwrap().split_once('=').unwrap();
        assert_eq!(key, "column");
        assert!(partition_line(key, value, PARTITION_LINES, &mut Vec::new()).is_err());
        // a partition's mass is a finite number, not negative
        for mass in ["3", "3 -1.0", "3 NaN", "3 inf", "x 1.0"] {
            let refused = partition_line("partition", mass, PARTITION_LINES, &mut Vec::new());
            assert!(refused.is_err(), "{mass:?}");
        }
    }
}
