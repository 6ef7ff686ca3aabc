//! The README and `docs/` keep their promises: every relative link names a file that
//! exists and every `#anchor` a heading of that file (GitHub's slugs), and the README
//! fits on a screen or so (at most 250 lines).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The Markdown pages: the README and everything under `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut folders = vec![repo().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages
}

/// A page's lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, punctuation but `-` and `_`
/// dropped; repeated headings get `-1`, `-2`, …
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose(text) {
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else { continue };
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !seen.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    seen
}

/// The targets of a page's inline links, `[text](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Inline code holds no link.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].split_whitespace().next().unwrap_or_default().to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let resolved = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&resolved).unwrap()).contains(anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_fits_on_a_screen_or_so_and_the_docs_have_an_index() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.lines().count() <= 250, "README.md has {} lines", readme.lines().count());
    let index = std::fs::read_to_string(repo().join("docs/index.md")).unwrap();
    for page in pages().iter().filter(|p| p.starts_with(repo().join("docs")) && !p.ends_with("index.md")) {
        let relative = page.strip_prefix(repo().join("docs")).unwrap().to_str().unwrap().to_string();
        assert!(index.contains(&format!("({relative}")), "docs/index.md does not list {relative}");
    }
}

/// The anchors and links read as GitHub reads them.
#[test]
fn anchors_and_links_are_read_as_github_does() {
    let page = "# Generator: history copula (`x`)\n## Ledger\n## Ledger\n```\n# not a heading\n```\n";
    let found = anchors(page);
    assert!(found.contains("generator-history-copula-x"), "{found:?}");
    assert!(found.contains("ledger") && found.contains("ledger-1") && !found.contains("not-a-heading"));
    let text = "see [a](docs/a.md#x) and `[b](no.md)`\n```\n[c](fenced.md)\n```\n[d](https://x.org)";
    assert_eq!(links(text), ["docs/a.md#x", "https://x.org"]);
}
