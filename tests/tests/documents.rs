//! The documents hold together: every section a comment or a document cites
//! (`docs/plugins.md, "Replay"`) exists in that document, and every relative link of the README
//! and `docs/` leads to a file that exists and, with a `#fragment`, to one of its headings. A
//! document reorganised without its citations fails here, not in a reader's hands.

use std::path::{Path, PathBuf};

use mmmq_tests::workspace_root;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir` (not `target/`, not hidden) whose name ends in one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if p.is_dir() {
            files(&p, exts, out);
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
}

/// A heading of a Markdown document (its level, 1 for the title), or a bold run-in term
/// (`**Checkpoints**:`, level 0), which comments cite as sections too.
#[derive(Debug, PartialEq)]
struct Section {
    level: usize,
    text: String,
}

/// The sections of a Markdown document. Code blocks and code spans are skipped.
fn sections(markdown: &str) -> Vec<Section> {
    let mut found = Vec::new();
    let mut fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        if line.starts_with('#') {
            let level = line.chars().take_while(|c| *c == '#').count();
            found.push(Section {
                level,
                text: line[level..].trim().to_owned(),
            });
            continue;
        }
        // Outside code spans: a glob `**` is no bold.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("**") {
            let Some(len) = rest[start + 2..].find("**") else {
                break;
            };
            let term = &rest[start + 2..start + 2 + len];
            found.push(Section {
                level: 0,
                text: term.trim_end_matches(['.', ':']).to_owned(),
            });
            rest = &rest[start + 2 + len + 2..];
        }
    }
    found
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Each cited document and section in `text` (the form `docs/plugins.md, "Replay"`), with the comment markers of a line break inside removed.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let cites = text
        .match_indices(".md,")
        .map(|(at, _)| (at + 3, at + 4))
        .chain(
            text.match_indices("README,")
                .map(|(at, _)| (at + 6, at + 7)),
        );
    for (file_end, after) in cites {
        let start = text[..file_end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "/_-.".contains(c)))
            .map_or(0, |i| i + 1);
        let file = match &text[start..file_end] {
            "README" => "README.md",
            f => f,
        };
        let rest = text[after..].trim_start_matches([' ', '\n', '/', '!']);
        let Some(quoted) = rest.strip_prefix('"') else {
            continue;
        };
        let Some(end) = quoted.find('"') else {
            continue;
        };
        let section = quoted[..end]
            .split('\n')
            .map(|l| l.trim().trim_start_matches(['/', '!']).trim())
            .collect::<Vec<_>>()
            .join(" ");
        found.push((file.to_owned(), section));
    }
    found
}

#[test]
fn the_sections_the_code_and_documents_cite_exist() {
    let root = workspace_root();
    let mut sources = Vec::new();
    for dir in [
        "broker",
        "core",
        "client",
        "plugin-sdk",
        "plugins",
        "tests",
        "docs",
        "scripts",
        "wit",
        "fuzz",
        "bench-peers",
        ".ci",
    ] {
        files(
            &root.join(dir),
            &[".rs", ".md", ".txt", ".html", ""],
            &mut sources,
        );
    }
    sources.push(root.join("README.md"));
    let mut checked = 0;
    let mut missing = Vec::new();
    for source in &sources {
        // This file's code holds the patterns it looks for; the scaffold's templates cite the
        // README of the crate they make, not this one.
        if source.ends_with("tests/tests/documents.rs")
            || source.starts_with(root.join("broker/src/plugin/scaffold"))
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(source) else {
            continue;
        };
        for (file, section) in citations(&text) {
            // `docs/x.md` from anywhere; `x.md` from inside docs/.
            let doc = [root.join(&file), root.join("docs").join(&file)]
                .into_iter()
                .find(|p| p.is_file());
            let Some(doc) = doc else {
                missing.push(format!("{}: {file} does not exist", source.display()));
                continue;
            };
            checked += 1;
            // A short citation of a long heading names its beginning ("Router" for "Router:
            // plugins that do real work"); never of the document's title, which would keep a
            // citation of a removed section green.
            let cited = |s: &Section| {
                s.text == section
                    || (s.level != 1
                        && s.text
                            .strip_prefix(section.as_str())
                            .is_some_and(|rest| !rest.starts_with(char::is_alphanumeric)))
            };
            if !sections(&read(&doc)).iter().any(cited) {
                missing.push(format!(
                    "{}: {file}, \"{section}\" is no section of it",
                    source.display()
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} citations found");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_documents_links_lead_somewhere() {
    let root = workspace_root();
    let mut docs = vec![root.join("README.md")];
    files(&root.join("docs"), &[".md"], &mut docs);
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        for (at, _) in text.match_indices("](") {
            let link = &text[at + 2..];
            let link = &link[..link.find(')').unwrap()];
            if link.starts_with("http") || link.starts_with('<') {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(path)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", doc.display()));
            } else if !fragment.is_empty() {
                // Only headings make anchors.
                let headings: Vec<String> = sections(&read(&target))
                    .iter()
                    .filter(|s| s.level > 0)
                    .map(|s| anchor(&s.text))
                    .collect();
                if !headings.iter().any(|h| h == fragment) {
                    broken.push(format!("{}: {link}: no such heading", doc.display()));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} links found");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn anchors_and_citations_are_read_as_github_and_comments_write_them() {
    assert_eq!(anchor("`mmmq serve`"), "mmmq-serve");
    assert_eq!(
        anchor("Write, deploy and change a handler"),
        "write-deploy-and-change-a-handler"
    );
    assert_eq!(
        citations("x (docs/plugins.md,\n    /// \"Deploying plugins\n    /// by API\") y"),
        vec![(
            "docs/plugins.md".to_owned(),
            "Deploying plugins by API".to_owned()
        )]
    );
    let texts = |md: &str| -> Vec<String> { sections(md).into_iter().map(|s| s.text).collect() };
    assert_eq!(
        texts("# A\n```\n# not\n```\n- **Checkpoints**: x **Emit.** y `a.**` z\n"),
        vec!["A", "Checkpoints", "Emit"]
    );
    assert_eq!(
        citations("(README, \"Install\")"),
        vec![("README.md".to_owned(), "Install".to_owned())]
    );
}

/// The `rust` blocks of a Markdown document.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim() == "```rust" => current = Some(String::new()),
            Some(_) if line.trim() == "```" => blocks.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The regions of `tests/examples/doc_snippets.rs`, without their indentation.
fn compiled_snippets(source: &str) -> Vec<String> {
    let mut snippets = Vec::new();
    let mut current: Option<String> = None;
    for line in source.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("// snippet: ") {
            current = Some(String::new());
        } else if trimmed == "// end snippet" {
            snippets.extend(current.take());
        } else if let Some(block) = &mut current {
            block.push_str(line.strip_prefix("    ").unwrap_or(line));
            block.push('\n');
        }
    }
    snippets
}

/// Every Rust snippet a reader may copy compiles: those of the client and embedding documents are
/// regions of an example that `cargo test` builds; the plugin snippets (README, docs/plugins.md)
/// are built in a fresh scaffold by `readme::the_readme_tour_runs_as_written` and
/// `scaffold::the_plugin_guides_snippets_build_in_a_fresh_scaffold`.
#[test]
fn the_rust_snippets_of_the_documents_compile() {
    let root = workspace_root();
    let compiled = compiled_snippets(&read(&root.join("tests/examples/doc_snippets.rs")));
    let mut docs = vec![root.join("README.md")];
    files(&root.join("docs"), &[".md"], &mut docs);
    let mut checked = 0;
    for doc in docs {
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        let built_in_a_scaffold = name == "README.md" || name == "docs/plugins.md";
        for block in rust_blocks(&read(&doc)) {
            if built_in_a_scaffold {
                assert!(
                    block.contains("mmmq_plugin_sdk::export!"),
                    "{name}: a rust block that is not a whole plugin is compiled by nothing:\n{block}"
                );
                continue;
            }
            checked += 1;
            assert!(
                compiled.contains(&block),
                "{name}: this rust block is not a region of tests/examples/doc_snippets.rs \
                 (copy it there, between `// snippet: NAME` and `// end snippet`):\n{block}"
            );
        }
    }
    assert_eq!(checked, 3, "the client, embedding and group snippets");
}
