//! How the CLI prints: tables of aligned columns, one JSON line with `--json`, and the short forms
//! people read in a table (a reason's first line, a retention as `14d`).

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
}
