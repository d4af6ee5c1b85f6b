//! What a user gets without this checkout (README, "Install"): publishable crates that carry the
//! WIT they bind to, and a binary that documents itself (`--version`, completions, man pages);
//! and documents whose every cited test exists.

use std::path::Path;
use std::process::Command;

use mmmq_tests::{mmmq_bin, run_ok, workspace_root};
use serde_json::Value;

/// The crates published to crates.io.
const PUBLISHED: [&str; 4] = ["mmmq-core", "mmmq-client", "mmmq-plugin-sdk", "mmmq"];

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `wit/` is the contract; the SDK and the broker each carry a copy inside their crate so they
/// can be packaged. A change to `wit/` must be copied to both.
#[test]
fn the_crates_wit_copies_are_identical_to_wit() {
    let root = workspace_root();
    let copies = [
        ("wit/0.2.0/plugin.wit", "plugin-sdk/wit/plugin.wit"),
        ("wit/plugin.wit", "broker/wit/plugin.wit"),
        ("wit/0.2.0/plugin.wit", "broker/wit/0.2.0/plugin.wit"),
    ];
    for (original, copy) in copies {
        assert!(
            read(&root.join(original)) == read(&root.join(copy)),
            "{copy} differs from {original}: copy it (cp {original} {copy})"
        );
    }
    // And nothing else is in `wit/` that the copies would miss.
    let mut files: Vec<String> = Vec::new();
    for dir in ["wit", "wit/0.2.0"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                files.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    files.sort();
    assert_eq!(files, ["wit/0.2.0/plugin.wit", "wit/plugin.wit"]);
}

/// crates.io shows these; `cargo publish` warns without some and refuses a bad keyword list.
#[test]
fn published_crates_have_complete_metadata() {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(workspace_root())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    for name in PUBLISHED {
        let p = packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} is a workspace member"));
        for field in [
            "description",
            "license",
            "repository",
            "homepage",
            "readme",
            "rust_version",
        ] {
            assert!(
                p[field].as_str().is_some_and(|s| !s.is_empty()),
                "{name} has no {field}"
            );
        }
        let keywords = p["keywords"].as_array().unwrap();
        assert!((1..=5).contains(&keywords.len()), "{name}: 1 to 5 keywords");
        assert!(keywords.iter().all(|k| {
            let k = k.as_str().unwrap();
            k.len() <= 20
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        }));
        assert!(!p["categories"].as_array().unwrap().is_empty(), "{name}");
        assert!(p["publish"].is_null(), "{name} is publishable");
        let manifest = Path::new(p["manifest_path"].as_str().unwrap());
        let readme = manifest
            .parent()
            .unwrap()
            .join(p["readme"].as_str().unwrap());
        assert!(
            readme.starts_with(manifest.parent().unwrap()) && readme.exists(),
            "{name}'s readme is its own: {}",
            readme.display()
        );
        // Its workspace dependencies are published too, so they carry a version.
        for dep in p["dependencies"].as_array().unwrap() {
            if dep["path"].is_string() && dep["kind"].is_null() {
                assert!(
                    PUBLISHED.contains(&dep["name"].as_str().unwrap()) && dep["req"] != "*",
                    "{name} depends on {} by path only",
                    dep["name"]
                );
            }
        }
    }
}

fn mmmq(args: &[&str]) -> String {
    String::from_utf8(run_ok(Command::new(mmmq_bin()).args(args)).stdout).unwrap()
}

#[test]
fn version_names_the_plugin_worlds_served() {
    let long = mmmq(&["--version"]);
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(
        lines,
        [
            format!("mmmq {}", env!("CARGO_PKG_VERSION")).as_str(),
            "plugin worlds: mmmq:plugin/handler@0.2.0, mmmq:plugin/handler@0.1.0",
            format!("plugin SDK: mmmq-plugin-sdk {}", env!("CARGO_PKG_VERSION")).as_str(),
        ]
    );
    assert_eq!(
        mmmq(&["-V"]).trim(),
        format!("mmmq {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The bash script completes for real: subcommands, nested subcommands and flags.
#[test]
fn bash_completion_completes_commands_and_flags() {
    let script = mmmq(&["completions", "bash"]);
    // Bash calls the function with the command, the word being completed and the one before.
    let complete = |words: &str| -> String {
        let all: Vec<&str> = words.split(' ').collect();
        let n = all.len() - 1;
        let (cur, prev) = (all[n], all[n - 1]);
        let out = run_ok(Command::new("bash").arg("-c").arg(format!(
            "{script}\nCOMP_WORDS=({words}); COMP_CWORD={n}; COMP_LINE='{words}'; \
             _mmmq mmmq {cur} {prev}; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )));
        String::from_utf8(out.stdout).unwrap()
    };
    let top = complete("mmmq ''");
    for sub in ["serve", "plugin", "completions", "man", "reload"] {
        assert!(top.lines().any(|l| l == sub), "{sub} in {top}");
    }
    let plugin = complete("mmmq plugin n");
    assert_eq!(plugin.trim(), "new");
    let flags = complete("mmmq plugin new --s");
    assert_eq!(flags.trim(), "--sdk-path");
    for (shell, marker) in [("zsh", "#compdef mmmq"), ("fish", "complete -c mmmq")] {
        assert!(mmmq(&["completions", shell]).contains(marker), "{shell}");
    }
}

#[test]
fn man_pages_cover_every_command() {
    let page = mmmq(&["man"]);
    assert!(page.contains(".TH mmmq 1"), "{page}");
    assert!(page.contains("mmmq\\-serve(1)") || page.contains("mmmq-serve(1)"));
    let tmp = tempfile::tempdir().unwrap();
    mmmq(&["man", "--out-dir", tmp.path().to_str().unwrap()]);
    for page in [
        "mmmq.1",
        "mmmq-serve.1",
        "mmmq-plugin-new.1",
        "mmmq-plugin-deploy.1",
    ] {
        let text = read(&tmp.path().join(page));
        assert!(text.starts_with(".ie") && text.contains(".TH"), "{page}");
    }
    // `--sdk-path` is documented on the scaffold's page, from its flag's doc comment.
    let new = read(&tmp.path().join("mmmq-plugin-new.1"));
    assert!(
        new.contains("sdk\\-path") && new.contains("checkout"),
        "{new}"
    );
}

/// Every test the documents cite for a promise (`file::test_name`, `module::tests::name`, a name
/// cut short with `…`) exists: a promise whose test was renamed or moved is cited by nothing.
#[test]
fn the_tests_the_documents_cite_exist() {
    let root = workspace_root();
    let sources: Vec<(std::path::PathBuf, String)> = ["broker", "core", "client", "plugin-sdk"]
        .iter()
        .flat_map(|krate| rust_files(&root.join(krate).join("src")))
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect();
    let mut checked = 0;
    let mut missing = Vec::new();
    let mut docs = vec![root.join("README.md")];
    docs.extend(markdown_files(&root.join("docs")));
    for path in docs {
        let text = read(&path);
        let doc = path.strip_prefix(&root).unwrap().display().to_string();
        for cited in text.split('`').skip(1).step_by(2) {
            let path = cited.trim_end_matches('…');
            let segments: Vec<&str> = path.split("::").collect();
            let is_test_path = segments.len() >= 2
                && segments.iter().all(|s| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                });
            let name = segments[segments.len() - 1];
            // A module of tests (`dedupe::tests`), or an HTTP handler (`plugins::deploy`) in a
            // sentence about routes, has no one name to look for.
            if !is_test_path || name == "tests" || !name.contains('_') {
                continue;
            }
            let wanted = format!("fn {name}");
            let file = root.join("tests/tests").join(format!("{}.rs", segments[0]));
            let found = if file.is_file() {
                read(&file).contains(&wanted)
            } else {
                sources.iter().any(|(_, s)| s.contains(&wanted))
            };
            checked += 1;
            if !found {
                missing.push(format!("{doc}: `{cited}`"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} citations found: is the parsing right?"
    );
    assert!(
        missing.is_empty(),
        "cited tests that do not exist:\n{}",
        missing.join("\n")
    );
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    files
}

/// The `.md` files directly in `dir`.
fn markdown_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}
