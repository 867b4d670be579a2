//! Typed records: a payload stored as named, typed arrays behind a small
//! header (docs/FORMAT.md, "Typed records"), all little-endian:
//!
//! ```text
//! 0..8     magic b"DRTTYPED"
//! 8..12    u32 version (1)
//! 12..16   u32 header length H (a multiple of 64; the first field starts there)
//! 16..18   u16 field count
//! then per field, in the source's order:
//!          u8 name length, name (UTF-8); u8 dtype length, dtype (numpy's
//!          `dtype.str`, e.g. "|u1", "<f4"); u8 ndim, ndim x u64 dims;
//!          u64 offset (from the record's start, a multiple of 64);
//!          u64 byte length
//! zeros up to H, then each field's C-order bytes at its offset
//! ```
//!
//! The one owner of the format: [`encode`] writes it (for the build),
//! [`parse`] reads a header, and [`first_unlike`] / [`gather`] copy one
//! field of every row of a batch. To the rest of the engine a typed record
//! is bytes like any other. Python gives numpy/torch the arrays.

use arrow::array::{Array, BinaryViewArray};

use crate::{Error, Result};

pub const MAGIC: &[u8; 8] = b"DRTTYPED";
pub const VERSION: u32 = 1;
/// Header length and every field's offset are multiples of this.
pub const ALIGN: usize = 64;
/// Magic, version, header length, field count.
pub const FIXED_LEN: usize = 18;

/// One field of a record: where its bytes lie and what they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldAt {
    pub name: String,
    /// numpy's `dtype.str`: `|b1`, `|u1`, `<i8`, `<f4`, `<c16`...
    pub dtype: String,
    pub shape: Vec<u64>,
    pub offset: u64,
    pub len: u64,
}

/// A record's header as parsed: its length and fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub header_len: usize,
    pub fields: Vec<FieldAt>,
}

impl Layout {
    /// Where the last field ends (the header's end for a record of none).
    pub fn end(&self) -> u64 {
        self.fields
            .iter()
            .map(|f| f.offset + f.len)
            .max()
            .unwrap_or(self.header_len as u64)
    }
}

/// Whether `payload` begins as a typed record does.
pub fn is_typed(payload: &[u8]) -> bool {
    payload.starts_with(MAGIC)
}

/// The byte size of one element of numpy dtype `code`, for the plain
/// little-endian numbers a typed record holds (bool, integers, floats,
/// complex); `None` for any other (an object dtype would make numpy read
/// a record's bytes as pointers).
pub fn item_size(code: &str) -> Option<u64> {
    let (order, rest) = code.split_at_checked(1)?;
    let (kind, size) = rest.split_at_checked(1)?;
    let size: u64 = size.parse().ok()?;
    let ok = match kind {
        "b" => size == 1,
        "i" | "u" => matches!(size, 1 | 2 | 4 | 8),
        // numpy's float16..float128 and complex64..complex256
        "f" => matches!(size, 2 | 4 | 8 | 16),
        "c" => matches!(size, 8 | 16 | 32),
        _ => false,
    };
    // one-byte types have no order ('|'); wider ones are little-endian
    let order_ok = match size {
        1 => order == "|",
        _ => order == "<",
    };
    (ok && order_ok).then_some(size)
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// One record: `fields` (name, dtype, shape, C-order bytes) behind its
/// header. A dtype that is not a plain little-endian number, bytes that
/// are not the shape's size, or a name or dtype over 255 bytes are invalid
/// input.
pub fn encode(fields: &[(&str, &str, &[u64], &[u8])]) -> Result<Vec<u8>> {
    let count = u16::try_from(fields.len())
        .map_err(|_| Error::invalid(format!("{} fields: at most 65535", fields.len())))?;
    let mut entries = Vec::with_capacity(fields.len());
    for &(name, dtype, shape, bytes) in fields {
        let size = item_size(dtype).ok_or_else(|| {
            Error::invalid(format!(
                "field '{name}' has dtype '{dtype}', not a little-endian number"
            ))
        })?;
        let want = shape.iter().try_fold(size, |n, &d| n.checked_mul(d));
        if want != Some(bytes.len() as u64) {
            return Err(Error::invalid(format!(
                "field '{name}': {} bytes for {dtype}{shape:?}",
                bytes.len()
            )));
        }
        let (name_len, ndim) = (u8::try_from(name.len()), u8::try_from(shape.len()));
        let (Ok(name_len), Ok(ndim)) = (name_len, ndim) else {
            return Err(Error::invalid(format!(
                "field '{name}': a name of at most 255 bytes and at most 255 dims"
            )));
        };
        let mut entry = vec![name_len];
        entry.extend_from_slice(name.as_bytes());
        entry.push(dtype.len() as u8); // item_size checked: 3 or 4 bytes
        entry.extend_from_slice(dtype.as_bytes());
        entry.push(ndim);
        for d in shape {
            entry.extend_from_slice(&d.to_le_bytes());
        }
        entries.push(entry);
    }
    let fixed = FIXED_LEN + entries.iter().map(|e| e.len() + 16).sum::<usize>();
    let header_len = align(fixed);
    let header_len32 = u32::try_from(header_len)
        .map_err(|_| Error::invalid("a typed record's header is over 4 GiB"))?;
    let mut out =
        Vec::with_capacity(header_len + fields.iter().map(|f| align(f.3.len())).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&header_len32.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    let mut offset = header_len;
    for (entry, &(_, _, _, bytes)) in entries.iter().zip(fields) {
        out.extend_from_slice(entry);
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        offset = align(offset + bytes.len());
    }
    out.resize(header_len, 0);
    for &(_, _, _, bytes) in fields {
        out.extend_from_slice(bytes);
        out.resize(align(out.len()), 0);
    }
    Ok(out)
}

/// Reads the little-endian parts of a header, with its bounds checked.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end =
            end.ok_or_else(|| format!("an entry at byte {} runs past the header", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn text(&mut self) -> std::result::Result<&'a str, String> {
        let n = self.u8()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|e| format!("a name is not UTF-8: {e}"))
    }
}

/// Why a header does not parse: the payload is not a typed record at all
/// (a cache of bytes), or it is one whose header is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotALayout {
    NotTyped,
    Damaged(String),
}

/// The layout of a typed record from its first bytes (`head`, its header
/// at least) and the record's length.
pub fn parse(head: &[u8], record_len: u64) -> std::result::Result<Layout, NotALayout> {
    if !is_typed(head) {
        return Err(NotALayout::NotTyped);
    }
    parse_typed(head, record_len).map_err(NotALayout::Damaged)
}

fn parse_typed(head: &[u8], record_len: u64) -> std::result::Result<Layout, String> {
    if head.len() < FIXED_LEN {
        return Err("shorter than its fixed part".into());
    }
    let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    let (version, header_len) = (word(8), word(12) as usize);
    let count = u16::from_le_bytes([head[16], head[17]]);
    if version != VERSION {
        return Err(format!("version {version}, this DatasetRT reads {VERSION}"));
    }
    if header_len as u64 > record_len || header_len % ALIGN != 0 || header_len < FIXED_LEN {
        return Err(format!(
            "header length {header_len} (record is {record_len} bytes)"
        ));
    }
    if header_len > head.len() {
        return Err(format!(
            "header length {header_len}, {} bytes given",
            head.len()
        ));
    }
    let mut cursor = Cursor {
        bytes: &head[..header_len],
        at: FIXED_LEN,
    };
    let fields = (0..count)
        .map(|_| field(&mut cursor, header_len as u64, record_len))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Layout { header_len, fields })
}

/// The header entry at the cursor: one field, checked to lie in the record.
fn field(
    c: &mut Cursor<'_>,
    header_len: u64,
    record_len: u64,
) -> std::result::Result<FieldAt, String> {
    let name = c.text()?.to_string();
    let dtype = c.text()?.to_string();
    let Some(size) = item_size(&dtype) else {
        return Err(format!(
            "field '{name}' has dtype '{dtype}', not a little-endian number"
        ));
    };
    let ndim = c.u8()?;
    let shape = (0..ndim)
        .map(|_| c.u64())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let (offset, len) = (c.u64()?, c.u64()?);
    if offset < header_len || offset.checked_add(len).is_none_or(|end| end > record_len) {
        return Err(format!("field '{name}' lies outside the record"));
    }
    if shape.iter().try_fold(size, |n, &d| n.checked_mul(d)) != Some(len) {
        return Err(format!("field '{name}': {len} bytes for {dtype}{shape:?}"));
    }
    Ok(FieldAt {
        name,
        dtype,
        shape,
        offset,
        len,
    })
}

/// The first of the first `rows` rows of `data` (all of them when there are
/// fewer) whose payload does not begin with `header` or is shorter than
/// `end` bytes; `None` when every such row's does and is (rows alike share
/// row 0's header, and so its layout). No slice of `data` (a slice copies
/// its list of buffers): a batch's row 0 is checked this way once per batch.
pub fn first_unlike(
    data: &BinaryViewArray,
    header: &[u8],
    end: usize,
    rows: usize,
) -> Option<usize> {
    (0..data.len().min(rows)).find(|&i| {
        let value = data.value(i);
        value.len() < end || !value.starts_with(header)
    })
}

/// Copy bytes `start..start + len` of each row of `data` into `out`, row
/// after row (rows checked alike by [`first_unlike`] first). On one thread:
/// a second one costs more to wake (14 µs through a pool, measured) than it
/// saves below a few MiB.
pub fn gather(data: &BinaryViewArray, start: usize, len: usize, out: &mut [u8]) {
    for (i, dst) in out.chunks_exact_mut(len).enumerate() {
        dst.copy_from_slice(&data.value(i)[start..start + len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Vec<u8> {
        let pixels: Vec<u8> = (0..48).collect();
        let label = 7i64.to_le_bytes();
        encode(&[
            ("image", "|u1", &[3, 4, 4], &pixels),
            ("label", "<i8", &[], &label),
        ])
        .unwrap()
    }

    #[test]
    fn a_record_parses_to_the_fields_it_was_encoded_from() {
        let record = image();
        let layout = parse(&record, record.len() as u64).unwrap();
        assert_eq!(layout.header_len % ALIGN, 0);
        let image = &layout.fields[0];
        assert_eq!(
            (image.name.as_str(), image.dtype.as_str()),
            ("image", "|u1")
        );
        assert_eq!((image.shape.clone(), image.len), (vec![3, 4, 4], 48));
        assert_eq!(image.offset as usize % ALIGN, 0);
        let at = image.offset as usize;
        assert_eq!(
            &record[at..at + 48],
            (0..48).collect::<Vec<u8>>().as_slice()
        );
        let label = &layout.fields[1];
        let at = label.offset as usize;
        assert_eq!(record[at..at + 8], 7i64.to_le_bytes());
        assert_eq!(layout.end(), label.offset + 8);
    }

    #[test]
    fn a_damaged_header_says_what_is_wrong_and_bytes_are_not_typed() {
        let record = image();
        let len = record.len() as u64;
        assert_eq!(parse(b"plain bytes", 11), Err(NotALayout::NotTyped));
        let mut version = record.clone();
        version[8] = 2;
        let mut count = record.clone();
        count[16] = 9;
        let first = parse(&record, len).unwrap().fields[0].offset;
        let cut = parse(&record, first + 10);
        for (bytes, at_len, says) in [
            (&record[..12], len, "fixed part"),
            (version.as_slice(), len, "version 2"),
            (count.as_slice(), len, "field ''"),
        ] {
            match parse(bytes, at_len) {
                Err(NotALayout::Damaged(why)) => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(cut, Err(NotALayout::Damaged(why)) if why.contains("outside")));
    }

    #[test]
    fn only_plain_little_endian_numbers_are_fields() {
        for good in [
            "|b1", "|u1", "|i1", "<i2", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16",
        ] {
            assert!(item_size(good).is_some(), "{good}");
        }
        for bad in [
            "|O", ">f4", "<u1", "|f4", "<V8", "<M8", "<U4", "", "<f", "<f3",
        ] {
            assert!(item_size(bad).is_none(), "{bad}");
        }
        let object = encode(&[("x", "|O", &[2], &[0; 16])]);
        assert!(matches!(object, Err(Error::InvalidInput { .. })));
        let short = encode(&[("x", "<f4", &[3], &[0; 8])]);
        assert!(matches!(short, Err(Error::InvalidInput { .. })));
    }
}
