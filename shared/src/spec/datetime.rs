//! Date and time values as people write them, in seconds since the Unix epoch.

use chrono::{DateTime, NaiveDate, NaiveDateTime};

/// Parses a date/time bound or value to seconds since the Unix epoch: the ISO 8601 forms
/// people's files hold (date only; a time after `T` or a space, with or without seconds
/// and fractions; `Z` or an offset, else UTC).
pub fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim();
    let seconds =
        |t: DateTime<chrono::FixedOffset>| t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6;
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(seconds(t));
    }
    // `Z` as the zero offset, so one set of forms reads both.
    let zoned = s.strip_suffix('Z').or_else(|| s.strip_suffix('z')).map(|t| format!("{t}+00:00"));
    for sep in ['T', ' '] {
        for time in ["%H:%M:%S%.f", "%H:%M"] {
            let naive = format!("%Y-%m-%d{sep}{time}");
            if let Some(z) = &zoned {
                if let Ok(t) = DateTime::parse_from_str(z, &format!("{naive}%:z")) {
                    return Some(seconds(t));
                }
            } else if let Ok(t) = DateTime::parse_from_str(s, &format!("{naive}%:z")) {
                return Some(seconds(t));
            } else if let Ok(t) = NaiveDateTime::parse_from_str(s, &naive) {
                return Some(t.and_utc().timestamp() as f64 + f64::from(t.and_utc().timestamp_subsec_micros()) * 1e-6);
            }
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d").ok().map(|d| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp() as f64)
}

/// Longest datetime `format` accepted.
const MAX_FORMAT_LEN: usize = 64;

/// A declared datetime `format` must be chrono syntax, short, without epoch seconds (`%s`),
/// and read back an instant it writes (its date, for a format without a time): else every
/// value would fail, or be read wrong, only once the job runs.
pub(super) fn check_datetime_format(format: &str) -> Result<(), String> {
    use chrono::format::{Item, StrftimeItems};
    if format.len() > MAX_FORMAT_LEN || format.contains("%s") {
        return Err(format!("must be at most {MAX_FORMAT_LEN} characters, without %s"));
    }
    if StrftimeItems::new(format).any(|item| matches!(item, Item::Error)) {
        return Err(format!("'{format}' is not chrono syntax"));
    }
    let instant = NaiveDate::from_ymd_opt(2001, 2, 3).unwrap().and_hms_opt(4, 5, 6).unwrap();
    let written = instant.format(format).to_string();
    let midnight = instant.date().and_hms_opt(0, 0, 0).unwrap();
    let read = parse_datetime_as(&written, format);
    let at = |t: NaiveDateTime| Some(t.and_utc().timestamp() as f64);
    let minute = instant.date().and_hms_opt(4, 5, 0).unwrap();
    if read != at(instant) && read != at(midnight) && read != at(minute) {
        return Err(format!("'{format}' does not read back the dates it writes (a date, and a time if any)"));
    }
    Ok(())
}

/// Parses a value in a declared chrono `format` (a date and time, or a date alone).
pub fn parse_datetime_as(s: &str, format: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_str(s, format) {
        return Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6);
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
        let t = t.and_utc();
        return Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6);
    }
    NaiveDate::parse_from_str(s, format).ok().map(|d| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp() as f64)
}
