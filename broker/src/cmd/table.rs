//! How the CLI prints: tables of aligned columns, one JSON line with `--json`, and the short forms
//! people read in a table (a reason's first line, a retention as `14d`, an age as `3m`).

use std::io::Write;

/// Prints rows as columns aligned under their headers.
pub fn table(headers: &[&str], rows: &[Vec<String>], out: &mut dyn Write) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>, out: &mut dyn Write| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(headers.to_vec(), out)?;
    for row in rows {
        line(row.iter().map(String::as_str).collect(), out)?;
    }
    Ok(())
}

/// The first line of a reason, with `…` when more follows (a table row is one line).
pub(super) fn first_line(reason: &str) -> String {
    match reason.split_once('\n') {
        Some((first, _)) => format!("{}…", first.trim_end()),
        None => reason.to_owned(),
    }
}

/// A topic's retention as people say it: `14d`, `90s`, `forever`, `1000000 B`, or both.
pub(super) fn retention(ms: Option<u64>, bytes: Option<u64>) -> String {
    let time = match ms {
        None => "forever".to_owned(),
        Some(ms) if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        Some(ms) if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        Some(ms) if ms % 1000 == 0 => format!("{}s", ms / 1000),
        Some(ms) => format!("{ms}ms"),
    };
    match bytes {
        None => time,
        Some(b) => format!("{time}, {b} B"),
    }
}

/// How long ago, as people say it: `42s`, `3m`, `5h`, `2d` (whole units, rounded down).
pub(super) fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A dispatcher's (or a redrive's) last error in a table: its age, first line and whether
/// delivery has worked since (`3m ago: connection refused (resolved)`), or `-`. `now` and `at`
/// are milliseconds since the Unix epoch.
pub(super) fn last_error(
    message: Option<&str>,
    at: Option<u64>,
    resolved_at: Option<u64>,
    now: u64,
) -> String {
    let Some(message) = message else {
        return "-".into();
    };
    let mut s = match at {
        Some(at) => format!(
            "{} ago: {}",
            age(now.saturating_sub(at)),
            first_line(message)
        ),
        // A broker older than `lastErrorAt`.
        None => first_line(message),
    };
    if resolved_at.is_some() {
        s.push_str(" (resolved)");
    }
    s
}

/// With `--json`, prints `value` as one line and says so (the caller prints nothing else).
pub fn print_json<T: serde::Serialize>(
    json: bool,
    value: &T,
    out: &mut dyn Write,
) -> std::io::Result<bool> {
    if json {
        writeln!(out, "{}", serde_json::to_string(value).expect("encodes"))?;
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    /// A reason of several lines shows as its first, marked as cut; one line shows whole.
    #[test]
    fn a_table_shows_the_first_line_of_a_reason() {
        assert_eq!(super::first_line("refused"), "refused");
        assert_eq!(
            super::first_line("plugin trapped  \nwasm backtrace:\n  0: f"),
            "plugin trapped…"
        );
    }

    #[test]
    fn a_last_error_shows_its_age_first_line_and_whether_it_is_over() {
        let now = 1_000_000_000;
        let minutes_ago = now - 3 * 60_000 - 59_999;
        assert_eq!(super::last_error(None, None, None, now), "-");
        assert_eq!(
            super::last_error(Some("refused\nmore"), Some(minutes_ago), None, now),
            "3m ago: refused…"
        );
        assert_eq!(
            super::last_error(Some("refused"), Some(now - 1500), Some(now), now),
            "1s ago: refused (resolved)"
        );
        // A clock behind the broker's, and a broker that does not say when.
        assert_eq!(
            super::last_error(Some("x"), Some(now + 5), None, now),
            "0s ago: x"
        );
        assert_eq!(super::last_error(Some("x"), None, None, now), "x");
        let ages = [59_999, 60_000, 3_599_999, 3_600_000, 86_400_000 * 3 - 1];
        assert_eq!(ages.map(super::age), ["59s", "1m", "59m", "1h", "2d"]);
    }
}
