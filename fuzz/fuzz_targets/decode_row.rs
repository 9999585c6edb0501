//! Fuzz target `decode_row`: [`lease_proto::reply::decode_text_row`] on arbitrary
//! columns.
//!
//! Drivers decode every row of every reply with it, and PostgreSQL (or a
//! pooler, or a broken proxy) may send anything, so it must never panic.
//! Beyond that, the target checks it against an independent reference
//! decoder for the text form of `int8`:
//!
//! - `Ok` exactly when every column is NULL or an optionally signed run of
//!   ASCII digits within `i64` range, with the same values;
//! - on error, the column is the first bad one and the text is that column's
//!   first 64 characters;
//! - a canonical column (what PostgreSQL prints: `0` or `-?[1-9][0-9]*`)
//!   re-encodes with `to_string` to exactly the text it came from.

#![no_main]

use lease_proto::reply::{decode_text_row, DecodeError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|columns: Vec<Option<&str>>| {
    let decoded = decode_text_row(columns.iter().copied());
    let expected = reference(&columns);
    assert_eq!(decoded, expected, "columns {columns:?}");
    if let Ok(row) = decoded {
        assert_eq!(row.len(), columns.len());
        for (text, value) in columns.iter().zip(&row) {
            let (Some(text), Some(value)) = (text, value) else {
                assert_eq!(text.is_none(), value.is_none());
                continue;
            };
            if canonical(text) {
                assert_eq!(&value.to_string(), text, "canonical text must round-trip");
            }
            // Whatever the input spelling, the value's canonical text decodes back.
            let again = decode_text_row([Some(value.to_string().as_str())]);
            assert_eq!(again, Ok(vec![Some(*value)]));
        }
    }
});

/// The reference decoder: NULL, or `[+-]?[0-9]+` within `i64` range.
fn reference(columns: &[Option<&str>]) -> Result<Vec<Option<i64>>, DecodeError> {
    columns
        .iter()
        .enumerate()
        .map(|(column, text)| match text {
            None => Ok(None),
            Some(t) => int8(t).map(Some).ok_or_else(|| DecodeError {
                column,
                text: t.chars().take(64).collect(),
            }),
        })
        .collect()
}

/// Parses `[+-]?[0-9]+` into an `i64` with checked arithmetic, accumulating
/// negatively so that `i64::MIN` fits.
fn int8(t: &str) -> Option<i64> {
    let (negative, digits) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() {
        return None;
    }
    let mut acc: i64 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
    }
    if negative {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

/// The text PostgreSQL prints for an `int8`: `0` or `-?[1-9][0-9]*`.
fn canonical(t: &str) -> bool {
    let digits = t.strip_prefix('-').unwrap_or(t);
    let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    all_digits && (digits == "0" && !t.starts_with('-') || !digits.starts_with('0'))
}
