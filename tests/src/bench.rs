//! What the benchmark programs share: medians, spreads, and writing their
//! section of BENCHMARKS.md between its markers (the hand-written notes
//! around the markers are kept).

use std::{fs, path::Path};

use anyhow::Result;

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// "median (min-max)", rounded to whole units.
pub fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.0} ({min:.0}-{max:.0})", median(v))
}

/// Replaces the `<!-- bench KEY: begin/end -->` section of BENCHMARKS.md
/// (appending it if absent) with `title`, how to reproduce, the date and
/// `report`.
pub fn write_section(key: &str, title: &str, reproduce: &str, report: &str) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
    let (begin, end) = (format!("<!-- bench {key}: begin -->"), format!("<!-- bench {key}: end -->"));
    let date = crate::run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let section =
        format!("{begin}\n## {title}\n\nReproduce: {reproduce}\nRun on {}.\n\n{report}{end}", date.trim());
    let text = fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".into());
    let text = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) => format!("{}{section}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n\n{section}\n", text.trim_end()),
    };
    fs::write(&path, text)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
