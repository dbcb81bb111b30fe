//! `cargo xtask docs`: the manual (`docs/`, Markdown pages read on the
//! forge, in a terminal or from `/usr/share/doc/limiter`) brought up to date
//! and checked: its generated key reference written from the key table,
//! then every relative link and `#anchor` in the README, BENCHMARKS.md and
//! the manual followed to a file and a heading. The metrics reference is
//! held to a real scrape by the `metrics_conventions` test.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

/// The documentation the tarball and the package carry, relative to the
/// workspace root: the README, BENCHMARKS.md and every page of the manual.
pub fn shipped() -> Result<Vec<String>> {
    let root = crate::root();
    let mut files = vec!["README.md".to_owned(), "BENCHMARKS.md".to_owned()];
    let mut pages: Vec<String> = fs::read_dir(root.join("docs"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    files.extend(pages);
    Ok(files)
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of `text` outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The anchors of a page's headings (a repeated heading's as GitHub
/// numbers them: `-1`, `-2`, …).
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The link targets of a line, code spans left out: inline links'
/// `(target)` and reference definitions' `[name]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            plain.push(c);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].split_whitespace().next().unwrap_or_default().to_owned());
        }
    }
    let trimmed = plain.trim_start();
    if trimmed.starts_with('[')
        && let Some((_, target)) = trimmed.split_once("]: ")
    {
        out.push(target.split_whitespace().next().unwrap_or_default().to_owned());
    }
    out
}

/// Every broken relative link or anchor in the shipped documentation, as
/// `file:line: what`; external links are counted, not followed (this
/// machine reaches no web).
pub fn check_links(root: &Path) -> Result<(Vec<String>, usize, usize)> {
    let mut broken = Vec::new();
    let (mut followed, mut external) = (0, 0);
    for file in shipped()? {
        let path = root.join(&file);
        let text = fs::read_to_string(&path)?;
        let dir = path.parent().unwrap_or(root).to_path_buf();
        for (n, line) in prose(&text) {
            for target in targets(line) {
                if target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    external += 1;
                    continue;
                }
                followed += 1;
                let (file_part, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let linked: PathBuf = if file_part.is_empty() { path.clone() } else { dir.join(file_part) };
                if !linked.exists() {
                    broken.push(format!("{file}:{n}: `{target}`: no file {}", linked.display()));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let page = fs::read_to_string(&linked).unwrap_or_default();
                    if !anchors(&page).contains(anchor) {
                        broken.push(format!("{file}:{n}: `{target}`: no heading with anchor #{anchor}"));
                    }
                }
            }
        }
    }
    Ok((broken, followed, external))
}

/// `cargo xtask docs`.
pub fn main() -> Result<()> {
    crate::status(
        "writing the key reference (docs/configuration.md)",
        crate::cargo()
            .args(["test", "--package", "limiter", "--lib", "--", "--exact"])
            .arg("config::tests::the_manual_key_reference_is_the_key_table")
            .env("LIMITER_BLESS", "1"),
    )?;
    let (broken, followed, external) = check_links(&crate::root())?;
    for b in &broken {
        eprintln!("{b}");
    }
    if !broken.is_empty() {
        bail!("{} broken links in the documentation", broken.len());
    }
    println!(
        "docs: {} pages, {followed} relative links and anchors followed, {external} external links not followed",
        shipped()?.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_as_github_makes_them() {
        assert_eq!(slug("Who can do what on a node"), "who-can-do-what-on-a-node");
        assert_eq!(slug("TLS and HTTP/2"), "tls-and-http2");
        assert_eq!(slug("The `kernel.ports` key"), "the-kernelports-key");
        assert_eq!(slug("Adaptive limits and criticality"), "adaptive-limits-and-criticality");
        assert_eq!(
            anchors("# A\n## A\n```\n# not\n```\n### B b\n"),
            BTreeSet::from(["a".into(), "a-1".into(), "b-b".into()])
        );
    }

    #[test]
    fn targets_leave_code_spans_out() {
        assert_eq!(targets("see [x](docs/a.md#b) and `[y](z)`"), vec!["docs/a.md#b"]);
        assert_eq!(targets("[ref]: fleet.md \"title\""), vec!["fleet.md"]);
    }

    /// The documentation as committed: every relative link and anchor
    /// lands.
    #[test]
    fn every_link_and_anchor_in_the_documentation_lands() {
        let (broken, followed, _) = check_links(&crate::root()).unwrap();
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
        assert!(followed > 20, "only {followed} links followed");
    }
}
