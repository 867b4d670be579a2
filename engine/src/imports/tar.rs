//! WebDataset tar shards, read for `datasetrt.sources.WebDataset`: the
//! members of a POSIX tar (ustar, GNU long names, pax headers) grouped into
//! samples and handed over as Arrow batches, no Python object per member.
//!
//! A sample is a run of consecutive regular files named `<key>.<ext>`: the
//! key is the name up to the first dot of its last path component, the
//! extension (lowercased) the rest, as WebDataset reads them. Files without
//! a dot, or whose last component starts with one, are not sample files and
//! are skipped, as are directories, links and other entries. Members of an
//! extension no caller asked for are skipped without being copied.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, LargeBinaryArray, StringArray};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};

const BLOCK: usize = 512;

/// The columns a batch holds beside one per extension: names no extension
/// can have (an extension holds no `/`).
pub const KEY: &str = "/key";
pub const MEMBERS: &str = "/members";

/// The samples of one tar shard, a batch at a time (see the module).
///
/// Each batch holds whole samples, in order: column [`KEY`] (Utf8), column
/// [`MEMBERS`] (Utf8: the sample's extensions, sorted, joined by `", "`) and
/// one nullable LargeBinary column per wanted extension, named by it: that
/// member's bytes (the last one, if a sample has two), null where the
/// sample has none. A batch holds at most `batch_rows` samples, and ends
/// before a sample whose first member would take it past `batch_bytes`
/// (a batch holds one sample at least, whatever its size).
pub struct TarSamples {
    path: PathBuf,
    input: BufReader<File>,
    /// the file's length when opened: a skip past it is a truncated shard
    len: u64,
    wanted: Vec<String>,
    batch_rows: usize,
    batch_bytes: usize,
    /// the header of a member already read that starts the next batch
    pending: Option<Member>,
    /// the archive's global pax header (type `g`), applied to every later member
    global: Pax,
    at: u64,
    done: bool,
}

/// What a pax header says of the members it applies to.
#[derive(Default)]
struct Pax {
    path: Option<String>,
    size: Option<u64>,
}

/// A regular file's name (split into key and extension) and size, its data
/// not read yet.
struct Member {
    key: String,
    ext: String,
    size: u64,
}

/// The samples of a batch being gathered: per wanted extension, the bytes of
/// every sample's member back to back and each sample's range (or none).
struct Gathered {
    keys: Vec<String>,
    members: Vec<BTreeSet<String>>,
    values: Vec<Vec<u8>>,
    ranges: Vec<Vec<Option<(usize, usize)>>>,
    bytes: usize,
}

impl TarSamples {
    /// Open the shard at `path`; members of the extensions `wanted`
    /// (lowercase) become columns.
    pub fn open(
        path: &Path,
        wanted: Vec<String>,
        batch_rows: usize,
        batch_bytes: usize,
    ) -> Result<TarSamples> {
        let file = File::open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        Ok(TarSamples {
            path: path.to_path_buf(),
            len,
            input: BufReader::with_capacity(1 << 20, file),
            wanted,
            batch_rows: batch_rows.max(1),
            batch_bytes: batch_bytes.max(1),
            pending: None,
            global: Pax::default(),
            at: 0,
            done: false,
        })
    }

    /// The next batch of samples, or `None` after the last.
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let mut values = vec![Vec::new(); self.wanted.len()];
        if let Some(first) = values.first_mut() {
            // the payloads' room for a whole batch, grown once at most
            // (untouched room is never committed memory)
            first.reserve(self.batch_bytes.min(1 << 30));
        }
        let mut batch = Gathered {
            keys: Vec::new(),
            members: Vec::new(),
            values,
            ranges: vec![Vec::new(); self.wanted.len()],
            bytes: 0,
        };
        while let Some(member) = self.next_member()? {
            let same = batch.keys.last() == Some(&member.key);
            let full = batch.keys.len() >= self.batch_rows
                || batch.bytes.saturating_add(member.size as usize) > self.batch_bytes;
            if !same && !batch.keys.is_empty() && full {
                self.pending = Some(member);
                break;
            }
            if !same {
                batch.keys.push(member.key.clone());
                batch.members.push(BTreeSet::new());
                batch.ranges.iter_mut().for_each(|r| r.push(None));
            }
            self.read_member(&member, &mut batch)?;
        }
        if batch.keys.is_empty() {
            return Ok(None);
        }
        self.to_arrow(batch).map(Some)
    }

    /// Copy a member's data into its column if its extension is wanted,
    /// else skip it; then the padding to the next block.
    fn read_member(&mut self, member: &Member, batch: &mut Gathered) -> Result<()> {
        let sample = batch.keys.len() - 1;
        batch.members[sample].insert(member.ext.clone());
        match self.wanted.iter().position(|w| *w == member.ext) {
            Some(column) => {
                if member.size > self.len.saturating_sub(self.at) {
                    // checked before any room is taken for it: a damaged
                    // size field must not become a huge allocation
                    return Err(self.bad(format!(
                        "member {}.{} of {} bytes runs past the end of the file (byte {})",
                        member.key, member.ext, member.size, self.len
                    )));
                }
                let size = member.size as usize;
                let values = &mut batch.values[column];
                if let Some((start, _)) = batch.ranges[column][sample] {
                    // a second member of one extension: the last one counts
                    // (its bytes are the column's last, so they go)
                    batch.bytes -= values.len() - start;
                    values.truncate(start);
                }
                let start = values.len();
                self.append(values, size)?;
                batch.ranges[column][sample] = Some((start, start + size));
                batch.bytes += size;
            }
            None => self.skip(member.size)?,
        }
        self.skip(padding(member.size))
    }

    fn to_arrow(&self, batch: Gathered) -> Result<RecordBatch> {
        let mut fields = vec![
            Field::new(KEY, DataType::Utf8, false),
            Field::new(MEMBERS, DataType::Utf8, false),
        ];
        let members: Vec<String> = batch
            .members
            .iter()
            .map(|m| m.iter().map(String::as_str).collect::<Vec<_>>().join(", "))
            .collect();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(batch.keys)),
            Arc::new(StringArray::from(members)),
        ];
        for ((ext, values), ranges) in self.wanted.iter().zip(batch.values).zip(batch.ranges) {
            fields.push(Field::new(ext, DataType::LargeBinary, true));
            columns.push(Arc::new(binary_column(values, &ranges)));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| Error::internal(format!("a tar shard's batch: {e}")))
    }

    /// The next regular file with a sample's name, or `None` at the end of
    /// the archive; every other entry is skipped, as Python's `tarfile`
    /// reads them: its data (if its type has any) skipped unread, a name
    /// from (in this order) a pax header before it, a GNU long name, the
    /// archive's global pax header, its own header.
    fn next_member(&mut self) -> Result<Option<Member>> {
        if let Some(member) = self.pending.take() {
            return Ok(Some(member));
        }
        let (mut long_name, mut local) = (None, Pax::default());
        while !self.done {
            let mut header = [0u8; BLOCK];
            let first = self.at;
            let read = self.fill_or_end(&mut header)?;
            if !read && first == 0 {
                return Err(self.bad("empty file".into()));
            }
            if !read || header.iter().all(|&b| b == 0) {
                self.done = true; // the end of the archive (zero blocks or none)
                break;
            }
            self.check_sum(&header, first)?;
            let size = match local.size.take().or(self.global.size) {
                Some(size) => size,
                None => self.octal(&header[124..136], first)?,
            };
            let kind = header[156];
            match kind {
                b'L' => long_name = Some(self.text(size)?),
                b'K' => drop(self.text(size)?), // a long link name: no sample's
                b'x' | b'X' => local = self.pax(size, first)?,
                b'g' => {
                    let global = self.pax(size, first)?;
                    self.global.path = global.path.or(self.global.path.take());
                    self.global.size = global.size.or(self.global.size);
                }
                _ => {
                    let name = match local.path.take().or(long_name.take()) {
                        Some(name) => name,
                        None => match &self.global.path {
                            Some(name) => name.clone(),
                            None => self.header_name(&header, first)?,
                        },
                    };
                    if kind == b'S' {
                        return Err(self.bad(format!("member {name:?} is a GNU sparse file")));
                    }
                    let file = matches!(kind, b'0' | b'7') || (kind == 0 && !name.ends_with('/'));
                    // links, devices, FIFOs and directories have no data,
                    // whatever their size says; a type tarfile does not know has
                    let data = file || !(b'1'..=b'6').contains(&kind) && kind != 0;
                    match sample_name(&name) {
                        Some((key, ext)) if file => return Ok(Some(Member { key, ext, size })),
                        _ if data => self.skip_member(size)?,
                        _ => {}
                    }
                }
            }
        }
        Ok(None)
    }

    /// The `path` and `size` of a pax header of `size` bytes at byte `at`.
    fn pax(&mut self, size: u64, at: u64) -> Result<Pax> {
        let mut pax = Pax::default();
        for (key, value) in pax_records(&self.text(size)?) {
            match key {
                "path" => pax.path = Some(value.to_string()),
                "size" => {
                    pax.size = Some(value.parse().map_err(|_| {
                        self.bad(format!("a pax header at byte {at} has size {value:?}"))
                    })?)
                }
                _ => {}
            }
        }
        Ok(pax)
    }

    /// A ustar header's name: `prefix/name` when the magic is POSIX's.
    fn header_name(&self, header: &[u8; BLOCK], at: u64) -> Result<String> {
        let field = |range: std::ops::Range<usize>| {
            let bytes = &header[range];
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            self.utf8(&bytes[..end], at)
        };
        let name = field(0..100)?;
        if &header[257..263] == b"ustar\0" {
            let prefix = field(345..500)?;
            if !prefix.is_empty() {
                return Ok(format!("{prefix}/{name}"));
            }
        }
        Ok(name)
    }

    /// A member's name as text: a name that is not UTF-8 is refused (read
    /// lossily, two names could become one key, merging their samples).
    fn utf8(&self, bytes: &[u8], at: u64) -> Result<String> {
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            self.bad(format!(
                "the member at byte {at} has a name that is not UTF-8: {}",
                String::from_utf8_lossy(bytes)
            ))
        })
    }

    /// A GNU long name or pax header's data (and its padding), as text.
    fn text(&mut self, size: u64) -> Result<String> {
        let at = self.at;
        if size > 1 << 20 {
            return Err(self.bad(format!("a {size}-byte name or pax header at byte {at}")));
        }
        let mut data = vec![0u8; size as usize];
        self.fill(&mut data)?;
        self.skip(padding(size))?;
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        self.utf8(&data[..end], at)
    }

    /// Skip a member's data and padding, unread.
    fn skip_member(&mut self, size: u64) -> Result<()> {
        match size.checked_add(padding(size)) {
            Some(n) => self.skip(n),
            None => Err(self.bad(format!("a member of {size} bytes at byte {}", self.at))),
        }
    }

    fn check_sum(&self, header: &[u8; BLOCK], at: u64) -> Result<()> {
        let stored = self.octal(&header[148..156], at)?;
        let (mut unsigned, mut signed) = (0u64, 0i64);
        for (i, &b) in header.iter().enumerate() {
            let b = if (148..156).contains(&i) { b' ' } else { b };
            unsigned += u64::from(b);
            signed += i64::from(b as i8);
        }
        if stored != unsigned && stored as i64 != signed {
            return Err(self.bad(format!(
                "the header at byte {at} is not a tar header (bad checksum)"
            )));
        }
        Ok(())
    }

    /// A header's number: octal digits (space or NUL padded), or base-256
    /// when the first byte's high bit is set.
    fn octal(&self, field: &[u8], at: u64) -> Result<u64> {
        if field[0] & 0x80 != 0 {
            let mut n = u64::from(field[0] & 0x7f);
            for &b in &field[1..] {
                n = n
                    .checked_mul(256)
                    .map(|n| n + u64::from(b))
                    .ok_or_else(|| {
                        self.bad(format!("the header at byte {at} has a number out of range"))
                    })?;
            }
            return Ok(n);
        }
        let digits = field
            .iter()
            .skip_while(|&&b| b == b' ' || b == 0)
            .take_while(|&&b| b != b' ' && b != 0);
        let mut n = 0u64;
        for &b in digits {
            if !(b'0'..=b'7').contains(&b) {
                return Err(self.bad(format!("the header at byte {at} is not a tar header")));
            }
            n = n
                .checked_mul(8)
                .map(|n| n + u64::from(b - b'0'))
                .ok_or_else(|| {
                    self.bad(format!("the header at byte {at} has a number out of range"))
                })?;
        }
        Ok(n)
    }

    /// Read exactly `buf.len()` bytes; the end of the file before that is
    /// invalid input (a truncated shard).
    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        if !self.fill_or_end(buf)? {
            return Err(self.bad(format!("unexpected end of data at byte {}", self.at)));
        }
        Ok(())
    }

    /// Like `fill`, but `false` when the file ends exactly here.
    fn fill_or_end(&mut self, buf: &mut [u8]) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(self.bad(format!("unexpected end of data at byte {}", self.at)))
                }
                Ok(n) => {
                    got += n;
                    self.at += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(&self.path)(e)),
            }
        }
        Ok(true)
    }

    /// Append the next `size` bytes to `values`: what the buffer holds,
    /// then the rest read from the file straight into the vector's spare
    /// room (one copy from the page cache, nothing zeroed first).
    fn append(&mut self, values: &mut Vec<u8>, size: usize) -> Result<()> {
        values.reserve(size);
        let held = self.input.buffer();
        let n = held.len().min(size);
        values.extend_from_slice(&held[..n]);
        self.input.consume(n);
        self.at += n as u64;
        let rest = (size - n) as u64;
        if rest > 0 {
            let got = self
                .input
                .get_mut()
                .take(rest)
                .read_to_end(values)
                .map_err(Error::io(&self.path))?;
            self.at += got as u64;
            if (got as u64) < rest {
                return Err(self.bad(format!("unexpected end of data at byte {}", self.at)));
            }
        }
        Ok(())
    }

    /// Skip `n` bytes (a member no column wants, padding): a seek, so a
    /// large member is never read; one past the file's end is a truncated
    /// shard.
    fn skip(&mut self, n: u64) -> Result<()> {
        let to = self.at.saturating_add(n);
        if to > self.len {
            self.at = self.len;
            return Err(self.bad(format!("unexpected end of data at byte {}", self.len)));
        }
        let step = i64::try_from(n).map_err(|_| self.bad(format!("a {n}-byte member")))?;
        self.input
            .seek_relative(step)
            .map_err(Error::io(&self.path))?;
        self.at = to;
        Ok(())
    }

    fn bad(&self, what: String) -> Error {
        Error::invalid(format!(
            "cannot read tar shard {}: {what}",
            self.path.display()
        ))
    }
}

/// Bytes from the end of `size` bytes of data to the next block.
fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// `(key, value)` of each record `"<len> <key>=<value>\n"` of a pax header.
fn pax_records(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|line| {
        let (_, record) = line.split_once(' ')?;
        record.split_once('=')
    })
}

/// A member's sample key and lowercased extension, as WebDataset (and
/// Python's `posixpath.split`) read a name; `None` for a file that is not a
/// sample's.
pub fn sample_name(name: &str) -> Option<(String, String)> {
    let (folder, base) = match name.rfind('/') {
        Some(i) => {
            let head = &name[..=i];
            let trimmed = head.trim_end_matches('/');
            (
                if trimmed.is_empty() { head } else { trimmed },
                &name[i + 1..],
            )
        }
        None => ("", name),
    };
    if base.starts_with('.') {
        return None;
    }
    let (stem, ext) = base.split_once('.')?;
    let key = if folder.is_empty() {
        stem.to_string()
    } else if folder.ends_with('/') {
        format!("{folder}{stem}")
    } else {
        format!("{folder}/{stem}")
    };
    Some((key, ext.to_lowercase()))
}

/// A nullable LargeBinary column of `values`, the rows' bytes back to back:
/// one `ranges` entry a row (a null row has none).
fn binary_column(values: Vec<u8>, ranges: &[Option<(usize, usize)>]) -> LargeBinaryArray {
    let mut offsets = Vec::with_capacity(ranges.len() + 1);
    offsets.push(0i64);
    for range in ranges {
        let last = *offsets.last().expect("one offset");
        offsets.push(range.map_or(last, |(_, end)| end as i64));
    }
    let nulls = NullBuffer::from(ranges.iter().map(Option::is_some).collect::<Vec<_>>());
    LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        values.into(),
        Some(nulls),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_as_webdataset_reads_them() {
        let split = |n: &str| sample_name(n);
        assert_eq!(split("a/b/000.JPG"), Some(("a/b/000".into(), "jpg".into())));
        assert_eq!(split("000.seg.png"), Some(("000".into(), "seg.png".into())));
        assert_eq!(split("a//x.cls"), Some(("a/x".into(), "cls".into())));
        assert_eq!(split("/x.cls"), Some(("/x".into(), "cls".into())));
        assert_eq!(split("a/.hidden.txt"), None);
        assert_eq!(split("README"), None);
    }
}
