//! The least and greatest value of a numeric column file, recorded in the
//! snapshot manifest beside the column (`range=` lines), so that a query's
//! filter can skip partitions without mapping them. A range is a pure
//! function of the column's content: a file shared by partitions, or kept
//! from the parent snapshot, keeps its range without being read again.
//!
//! The order is Arrow's (and so DataFusion's comparisons'): nulls are left
//! out, and for floats NaN is greater than every number and -0.0 less than
//! 0.0. A column with no non-null value, and a type outside integers and
//! floats, has no range.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::{cast, max, min};
use arrow::datatypes::*;

/// `(least, greatest)` of a column, in the widest type of its kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ColumnRange {
    Int(i64, i64),
    UInt(u64, u64),
    Float(f64, f64),
}

impl ColumnRange {
    /// The range of `array`, or `None` (no non-null value, or a type
    /// without one).
    pub fn of(array: &dyn Array) -> Option<ColumnRange> {
        macro_rules! range {
            ($kind:ident, $t:ty, $wide:ty) => {{
                let a = array.as_primitive::<$t>();
                Some(ColumnRange::$kind(min(a)? as $wide, max(a)? as $wide))
            }};
        }
        match array.data_type() {
            DataType::Int8 => range!(Int, Int8Type, i64),
            DataType::Int16 => range!(Int, Int16Type, i64),
            DataType::Int32 => range!(Int, Int32Type, i64),
            DataType::Int64 => range!(Int, Int64Type, i64),
            DataType::UInt8 => range!(UInt, UInt8Type, u64),
            DataType::UInt16 => range!(UInt, UInt16Type, u64),
            DataType::UInt32 => range!(UInt, UInt32Type, u64),
            DataType::UInt64 => range!(UInt, UInt64Type, u64),
            DataType::Float32 => range!(Float, Float32Type, f64),
            DataType::Float64 => range!(Float, Float64Type, f64),
            _ => None,
        }
    }

    /// The manifest text: `i <min> <max>`, `u ...` or `f ...` (floats in
    /// Rust's shortest exact form, `NaN` and `inf` included, and `-NaN` for
    /// a NaN with its sign bit set, the least float in Arrow's order).
    pub fn text(&self) -> String {
        let float = |v: f64| match v.is_nan() && v.is_sign_negative() {
            true => "-NaN".to_string(),
            false => format!("{v:?}"),
        };
        match self {
            ColumnRange::Int(a, b) => format!("i {a} {b}"),
            ColumnRange::UInt(a, b) => format!("u {a} {b}"),
            ColumnRange::Float(a, b) => format!("f {} {}", float(*a), float(*b)),
        }
    }

    pub fn parse(text: &str) -> Option<ColumnRange> {
        let mut parts = text.split(' ');
        let (kind, a, b) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let range = match kind {
            "i" => ColumnRange::Int(a.parse().ok()?, b.parse().ok()?),
            "u" => ColumnRange::UInt(a.parse().ok()?, b.parse().ok()?),
            "f" => {
                let float = |t: &str| match t {
                    "-NaN" => Some(-f64::NAN),
                    t => t.parse().ok(),
                };
                let (a, b) = (float(a)?, float(b)?);
                // a NaN end prunes nothing (`arrays`); written before `-NaN`
                // was, a negative NaN's least end reads `NaN`: still a range
                if a.is_nan() || b.is_nan() {
                    return Some(ColumnRange::Float(a, b));
                }
                ColumnRange::Float(a, b)
            }
            _ => return None,
        };
        range.ordered().then_some(range)
    }

    fn ordered(&self) -> bool {
        match *self {
            ColumnRange::Int(a, b) => a <= b,
            ColumnRange::UInt(a, b) => a <= b,
            ColumnRange::Float(a, b) => a.total_cmp(&b).is_le(),
        }
    }

    /// `(least, greatest)` as one-element arrays of `data_type` (the
    /// column's), or `None` if this range is not of that type's kind.
    ///
    /// For pruning, floats as SQL has them: a range with a NaN end says
    /// nothing (a NaN's sign does not survive the text, and SQL has one
    /// NaN), and -0.0 is the zero, so `f = 0.0` keeps a part of -0.0s.
    pub fn arrays(&self, data_type: &DataType) -> Option<(ArrayRef, ArrayRef)> {
        use arrow::array::{Float64Array, Int64Array, UInt64Array};
        let zero = |x: f64| if x == 0.0 { 0.0 } else { x };
        let (a, b): (ArrayRef, ArrayRef) = match (*self, data_type) {
            (ColumnRange::Float(a, b), _) if a.is_nan() || b.is_nan() => return None,
            (ColumnRange::Int(a, b), t) if t.is_signed_integer() => (
                std::sync::Arc::new(Int64Array::from(vec![a])),
                std::sync::Arc::new(Int64Array::from(vec![b])),
            ),
            (ColumnRange::UInt(a, b), t) if t.is_unsigned_integer() => (
                std::sync::Arc::new(UInt64Array::from(vec![a])),
                std::sync::Arc::new(UInt64Array::from(vec![b])),
            ),
            (ColumnRange::Float(a, b), DataType::Float32 | DataType::Float64) => (
                std::sync::Arc::new(Float64Array::from(vec![zero(a)])),
                std::sync::Arc::new(Float64Array::from(vec![zero(b)])),
            ),
            _ => return None,
        };
        // the values came from a column of this type: the cast is exact
        Some((cast(&a, data_type).ok()?, cast(&b, data_type).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, Float64Array, Int16Array, StringArray, UInt64Array};

    #[test]
    fn float_ranges_prune_as_sql_orders_floats() {
        let f64s = &DataType::Float64;
        assert!(ColumnRange::Float(-1.0, f64::NAN).arrays(f64s).is_none());
        assert!(ColumnRange::Float(-f64::NAN, 2.0).arrays(f64s).is_none());
        let (least, most) = ColumnRange::Float(-0.0, -0.0).arrays(f64s).unwrap();
        for end in [least, most] {
            let end = end
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .value(0);
            assert!(end == 0.0 && end.is_sign_positive());
        }
    }

    #[test]
    fn ranges_leave_out_nulls_and_order_floats_as_arrow_does() {
        let ints = Int16Array::from(vec![Some(4), None, Some(-7), Some(3)]);
        assert_eq!(ColumnRange::of(&ints), Some(ColumnRange::Int(-7, 4)));
        let big = UInt64Array::from(vec![u64::MAX, 1]);
        assert_eq!(ColumnRange::of(&big), Some(ColumnRange::UInt(1, u64::MAX)));
        let floats = Float64Array::from(vec![0.0, -0.0, f64::NAN, 2.5]);
        let Some(ColumnRange::Float(a, b)) = ColumnRange::of(&floats) else {
            panic!("a float range")
        };
        assert!(a == 0.0 && a.is_sign_negative() && b.is_nan(), "{a} {b}");
        assert_eq!(
            ColumnRange::of(&Float64Array::from(vec![None::<f64>])),
            None
        );
        assert_eq!(ColumnRange::of(&StringArray::from(vec!["a"])), None);
    }

    #[test]
    fn ranges_round_trip_through_their_text_exactly() {
        for range in [
            ColumnRange::Int(i64::MIN, i64::MAX),
            ColumnRange::UInt(0, u64::MAX),
            ColumnRange::Float(-0.0, f64::NAN),
            ColumnRange::Float(f64::NEG_INFINITY, 0.1 + 0.2),
            ColumnRange::Float(f32::MIN_POSITIVE as f64, f32::MAX as f64),
        ] {
            let back = ColumnRange::parse(&range.text()).unwrap();
            assert_eq!(back.text(), range.text());
        }
        for bad in ["i 5 4", "f 2.0 1.0", "x 1 2", "i 1", "i 1 2 3", "u -1 2"] {
            assert_eq!(ColumnRange::parse(bad), None, "{bad}");
        }
        // a negative NaN, the least float, keeps its sign in the text
        let negative = ColumnRange::of(&Float64Array::from(vec![-f64::NAN, 1.0])).unwrap();
        assert_eq!(negative.text(), "f -NaN 1.0");
        let Some(ColumnRange::Float(a, _)) = ColumnRange::parse(&negative.text()) else {
            panic!("a float range")
        };
        assert!(a.is_nan() && a.is_sign_negative());
        // as the text of one read before `-NaN` was written: a range still
        assert!(ColumnRange::parse("f NaN 1.0").is_some());
    }

    #[test]
    fn a_range_becomes_arrays_of_its_column_type() {
        let floats = Float32Array::from(vec![1.5f32, -3.25]);
        let range = ColumnRange::of(&floats).unwrap();
        let (a, b) = range.arrays(&DataType::Float32).unwrap();
        assert_eq!(a.as_primitive::<Float32Type>().value(0), -3.25);
        assert_eq!(b.as_primitive::<Float32Type>().value(0), 1.5);
        assert!(range.arrays(&DataType::Int64).is_none());
        let (a, _) = ColumnRange::Int(-2, 9).arrays(&DataType::Int8).unwrap();
        assert_eq!(a.data_type(), &DataType::Int8);
    }
}
