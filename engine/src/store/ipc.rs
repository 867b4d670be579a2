//! Arrow IPC files: written atomically, read zero-copy from a read-only mmap.
//!
//! Every process that opens the same file maps the same pages, so the OS
//! shares them (loader workers, ranks on one host).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::convert::fb_to_schema;
use arrow::ipc::reader::{read_footer_length, FileDecoder};
use arrow::ipc::writer::FileWriter;
use arrow::ipc::{root_as_footer, Block};

use super::checksum::CrcWriter;
use super::fs::{map_buffer, temp_sibling};
use crate::{Error, Result};

/// A complete, fsynced temporary file, its CRC-32C and length, and the
/// CRC-32C of each of its chunks (`chunks::CHUNK`). Dropping it removes the
/// temporary file if it is still there: a caller that fails between the
/// write and the publish (a full disk writing a sidecar) leaves nothing
/// behind, in a process that may live on and open the dataset again.
#[derive(Debug)]
pub struct Written {
    pub path: PathBuf,
    pub crc: u32,
    pub len: u64,
    pub chunks: Vec<u32>,
}

impl Drop for Written {
    fn drop(&mut self) {
        // published: renamed or linked and removed, nothing is there
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Write `batches` as an uncompressed Arrow IPC file at a temporary sibling
/// of `path`, fsync it and return it (the caller publishes).
pub fn write_temp(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Written> {
    let tmp = temp_sibling(path);
    // Arrow reports a failed write (a full disk...) without the path: add it.
    let arrow_err = |e: ArrowError| match e {
        ArrowError::IoError(_, source) => Error::io(&tmp)(source),
        other => Error::from(other),
    };
    let result = (|| {
        let file = File::create(&tmp).map_err(Error::io(&tmp))?;
        let sink = CrcWriter::new(BufWriter::with_capacity(1 << 20, file));
        let mut writer = FileWriter::try_new(sink, schema).map_err(arrow_err)?;
        for batch in batches {
            writer.write(batch).map_err(arrow_err)?;
        }
        writer.finish().map_err(arrow_err)?;
        let (buffered, crc, len, chunks) = writer.into_inner().map_err(arrow_err)?.finish();
        let file = buffered
            .into_inner()
            .map_err(|e| Error::io(&tmp)(e.into_error()))?;
        file.sync_all().map_err(Error::io(&tmp))?;
        Ok((crc, len, chunks))
    })();
    match result {
        Ok((crc, len, chunks)) => Ok(Written {
            path: tmp,
            crc,
            len,
            chunks,
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Map an Arrow IPC file and decode its batches without copying the columns.
pub fn read_mapped(path: &Path, what: &'static str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    decode(path, map_buffer(path, what)?)
}

/// [`read_mapped`] for a file whose checksum already matched the one
/// recorded when it was written (see [`decode_verified`]).
pub fn read_mapped_verified(
    path: &Path,
    what: &'static str,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    decode_inner(path, map_buffer(path, what)?, false)
}

/// Decode the Arrow IPC file `buffer` (the bytes of `path`) without copying,
/// every array checked in full (offsets, bitmaps, UTF-8): for bytes no
/// checksum vouches for.
pub fn decode(path: &Path, buffer: Buffer) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    decode_inner(path, buffer, true)
}

/// [`decode`] for bytes whose CRC-32C matched the one recorded when we wrote
/// them: the arrays were valid then, so the full check (about 10 ns a string
/// row: +100 ms to open 10M rows) is skipped. Panics stay impossible either
/// way; what a forged file could still do is fail later, not read memory.
pub fn decode_verified(path: &Path, buffer: Buffer) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    decode_inner(path, buffer, false)
}

/// What an Arrow IPC file's footer says: the schema, the format version,
/// and the dictionary and record batch blocks.
struct Footer {
    schema: SchemaRef,
    version: arrow::ipc::MetadataVersion,
    dictionaries: Vec<Block>,
    records: Vec<Block>,
}

/// Read the footer of `buffer` (the bytes of `path`). `check` is called on
/// each range of bytes before they are read.
fn footer(
    path: &Path,
    buffer: &Buffer,
    check: &dyn Fn(std::ops::Range<usize>) -> Result<()>,
) -> Result<Footer> {
    let len = buffer.len();
    let bad = |detail: String| Error::corrupt(path, detail);
    if len < 10 {
        return Err(bad(format!("Arrow IPC file is {len} bytes, too short")));
    }
    check(len - 10..len)?;
    let trailer: [u8; 10] = buffer[len - 10..].try_into().expect("10 bytes");
    let footer_len = read_footer_length(trailer).map_err(|e| bad(e.to_string()))?;
    if footer_len + 10 > len {
        return Err(bad(format!(
            "footer length {footer_len} exceeds file length {len}"
        )));
    }
    check(len - 10 - footer_len..len - 10)?;
    let footer = root_as_footer(&buffer[len - 10 - footer_len..len - 10])
        .map_err(|e| bad(format!("unreadable footer: {e}")))?;
    let fb_schema = footer
        .schema()
        .ok_or_else(|| bad("footer has no schema".into()))?;
    // fb_to_schema panics on some malformed schemas (found by the fuzzer)
    let schema = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fb_to_schema(fb_schema)))
        .map(Arc::new)
        .map_err(|_| bad("unreadable schema in the footer".into()))?;
    Ok(Footer {
        schema,
        version: footer.version(),
        dictionaries: footer.dictionaries().iter().flatten().copied().collect(),
        records: footer.recordBatches().iter().flatten().copied().collect(),
    })
}

/// The schema of the Arrow IPC file `buffer` (the bytes of `path`), after
/// `check` has been called on every byte range a decode reads to find the
/// arrays: the trailer, the footer and each message's metadata. The bodies
/// (the arrays' values) are not read: the caller checks what it reads of
/// them before reading it (see `chunks::ChunkCheck`).
pub fn checked_metadata(
    path: &Path,
    buffer: &Buffer,
    check: &dyn Fn(std::ops::Range<usize>) -> Result<()>,
) -> Result<SchemaRef> {
    let found = footer(path, buffer, check)?;
    for block in found.dictionaries.iter().chain(&found.records) {
        let start = usize::try_from(block.offset())
            .map_err(|_| Error::corrupt(path, "negative block offset"))?;
        let end = start.saturating_add(block.metaDataLength().max(0) as usize);
        check(start..end.min(buffer.len()))?;
    }
    Ok(found.schema)
}

fn decode_inner(
    path: &Path,
    buffer: Buffer,
    validate: bool,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let len = buffer.len();
    let bad = |detail: String| Error::corrupt(path, detail);
    let Footer {
        schema,
        version,
        dictionaries,
        records,
    } = footer(path, &buffer, &|_| Ok(()))?;
    // arrow's decoder trusts the buffer offsets inside a message and panics
    // on ones past the body (found by engine/tests/it/fuzz.rs, as were the
    // schema panic above and arrays it returns invalid): a damaged
    // file must be an error naming it, never a panic. Every file reaching
    // here has passed its checksum, so only a crafted one gets this far.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut decoder = FileDecoder::new(schema.clone(), version);
        let block_slice = |block: &Block| -> Result<Buffer> {
            let start =
                usize::try_from(block.offset()).map_err(|_| bad("negative block offset".into()))?;
            let size = block.metaDataLength() as usize + block.bodyLength() as usize;
            if start.checked_add(size).is_none_or(|end| end > len) {
                return Err(bad(format!(
                    "block at {start}+{size} runs past the end ({len} bytes)"
                )));
            }
            Ok(buffer.slice_with_length(start, size))
        };
        for block in &dictionaries {
            decoder
                .read_dictionary(block, &block_slice(block)?)
                .map_err(|e| bad(e.to_string()))?;
        }
        let mut batches = Vec::new();
        for block in &records {
            if let Some(batch) = decoder
                .read_record_batch(block, &block_slice(block)?)
                .map_err(|e| bad(e.to_string()))?
            {
                batches.push(batch);
            }
        }
        // The decoder checks lengths, not contents (offsets, bitmaps): an
        // array it returns can still make a later reader panic. Check fully.
        for batch in batches.iter().filter(|_| validate) {
            for column in batch.columns() {
                column
                    .to_data()
                    .validate_full()
                    .map_err(|e| bad(format!("invalid Arrow data: {e}")))?;
            }
        }
        Ok::<_, Error>(batches)
    }));
    let batches = match decoded {
        Ok(result) => result?,
        Err(_) => return Err(bad("Arrow IPC data that cannot be decoded".into())),
    };
    Ok((schema, batches))
}
