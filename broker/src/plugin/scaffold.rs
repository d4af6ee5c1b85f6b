//! `mmmq plugin new NAME` (docs/plugins.md, "Write, deploy and change a handler"): a plugin crate
//! that builds as it is, anywhere, with nothing but this binary and cargo. It depends on the SDK
//! of this binary's version from crates.io when cargo can take it from there ([`index`]); else
//! this binary writes the SDK's sources, which it carries, beside the plugin ([`vendor`]). With
//! `--sdk-path` it depends on a checkout's `plugin-sdk/` instead.

use std::path::{Path, PathBuf};

use super::worlds::WORLD_V2;

pub mod index;
pub mod vendor;

/// The SDK version a scaffold depends on: the version of the SDK this binary carries. The SDK and
/// the broker are released together, with the workspace's one version, so this binary serves
/// exactly the world that SDK builds.
pub const SDK_VERSION: &str = mmmq_plugin_sdk::sources::VERSION;

/// Where a scaffold takes the SDK from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sdk {
    /// `mmmq-plugin-sdk = "{SDK_VERSION}"` from crates.io.
    Registry,
    /// The SDK's sources this binary carries, written to `mmmq-plugin-sdk/` in the crate and
    /// depended on by path (and version, so that deleting the path switches to crates.io).
    Vendored,
    /// A path dependency on an mmmq checkout's `plugin-sdk` directory, for development.
    Path(PathBuf),
}

/// `mmmq plugin new` without `--sdk-path` or `--vendor-sdk`: the registry when the index at
/// `index_url` lists [`SDK_VERSION`], else the SDK this binary carries, with the reason.
pub async fn registry_or_vendored(index_url: &str) -> (Sdk, Option<index::Unpublished>) {
    match index::published(index_url, SDK_VERSION).await {
        Ok(()) => (Sdk::Registry, None),
        Err(why) => (Sdk::Vendored, Some(why)),
    }
}

/// Why a scaffold could not be written.
#[derive(Debug, thiserror::Error)]
pub enum NewError {
    /// The name cannot be a crate name.
    #[error(
        "{0:?} is not a crate name: use lower-case letters, digits, '-' and '_', starting with a letter"
    )]
    BadName(String),
    /// Something is already there.
    #[error("{0} already exists")]
    Exists(PathBuf),
    /// `--sdk-path` is not an SDK.
    #[error("{0} is not the plugin SDK (no Cargo.toml naming mmmq-plugin-sdk)")]
    NotAnSdk(PathBuf),
    /// Writing failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// Writes a plugin crate `name` under `dir` that builds as it is; returns its directory.
pub fn new(name: &str, dir: &Path, sdk: &Sdk) -> Result<PathBuf, NewError> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(NewError::BadName(name.to_owned()));
    }
    let sdk_dependency = match sdk {
        Sdk::Registry => format!("\"{SDK_VERSION}\""),
        Sdk::Vendored => format!(
            "{{ path = \"{}\", version = \"{SDK_VERSION}\" }}",
            vendor::DIR
        ),
        Sdk::Path(path) => {
            let manifest = std::fs::read_to_string(path.join("Cargo.toml")).unwrap_or_default();
            if !manifest.contains("name = \"mmmq-plugin-sdk\"") {
                return Err(NewError::NotAnSdk(path.clone()));
            }
            // Absolute, so the crate can be moved next to it; TOML escapes like a JSON string.
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            format!(
                "{{ path = {} }}",
                serde_json::Value::from(path.display().to_string())
            )
        }
    };
    let root = dir.join(name);
    if root.exists() {
        return Err(NewError::Exists(root));
    }
    let vendored = *sdk == Sdk::Vendored;
    let fill = |template: &str| {
        template
            // First: the vendored-SDK text has placeholders of its own.
            .replace(
                "{sdk_note}",
                if vendored {
                    include_str!("scaffold/vendored-note.md.txt")
                } else {
                    ""
                },
            )
            .replace(
                "{sdk_comment}",
                if vendored {
                    include_str!("scaffold/vendored-comment.toml.txt")
                } else {
                    ""
                },
            )
            .replace("{name}", name)
            .replace("{lib}", &name.replace('-', "_"))
            .replace("{world}", WORLD_V2)
            .replace("{sdk_version}", SDK_VERSION)
            .replace("{sdk}", &sdk_dependency)
    };
    let mut files = vec![
        (
            "Cargo.toml".to_owned(),
            fill(include_str!("scaffold/Cargo.toml.txt")),
        ),
        (
            "src/lib.rs".to_owned(),
            include_str!("scaffold/lib.rs.txt").to_owned(),
        ),
        (
            "README.md".to_owned(),
            fill(include_str!("scaffold/README.md.txt")),
        ),
        (".gitignore".to_owned(), "/target\n".to_owned()),
    ];
    if vendored {
        files.extend(vendor::files());
    }
    for (rel, text) in files {
        let path = root.join(rel);
        let io = |error| NewError::Io {
            path: path.clone(),
            error,
        };
        std::fs::create_dir_all(path.parent().expect("has a parent")).map_err(io)?;
        std::fs::write(&path, text).map_err(io)?;
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// What the README and the manifest of every scaffold say, whatever the SDK.
    fn check_common(root: &Path) {
        let manifest = read(&root.join("Cargo.toml"));
        let readme = read(&root.join("README.md"));
        for command in [
            "cargo build --release --target wasm32-wasip2",
            "mmmq plugin check target/wasm32-wasip2/release/my_handler.wasm",
            "mmmq plugin deploy target/wasm32-wasip2/release/my_handler.wasm --name my-handler",
            "mmmq reload",
        ] {
            assert!(readme.contains(command), "{command} in\n{readme}");
        }
        for placeholder in [
            "{name}",
            "{lib}",
            "{world}",
            "{sdk_version}",
            "{sdk}",
            "{sdk_note}",
            "{sdk_comment}",
        ] {
            assert!(!readme.contains(placeholder) && !manifest.contains(placeholder));
        }
    }

    #[tokio::test]
    async fn an_sdk_the_index_lists_is_taken_from_the_registry() {
        let line = format!(r#"{{"name":"mmmq-plugin-sdk","vers":"{SDK_VERSION}","yanked":false}}"#);
        let url = index::fake_index(line).await;
        assert_eq!(registry_or_vendored(&url).await, (Sdk::Registry, None));

        let tmp = tempfile::tempdir().unwrap();
        let root = new("my-handler", tmp.path(), &Sdk::Registry).unwrap();
        check_common(&root);
        let manifest = read(&root.join("Cargo.toml"));
        assert!(
            manifest.contains(&format!("\nmmmq-plugin-sdk = \"{SDK_VERSION}\"\n")),
            "{manifest}"
        );
        assert!(!root.join(vendor::DIR).exists());
        assert!(!read(&root.join("README.md")).contains("## The SDK in"));
    }

    #[tokio::test]
    async fn an_sdk_the_index_does_not_list_is_written_beside_the_plugin() {
        let url = index::fake_index(
            r#"{"name":"mmmq-plugin-sdk","vers":"0.0.1","yanked":false}"#.to_owned(),
        )
        .await;
        assert_eq!(
            registry_or_vendored(&url).await,
            (
                Sdk::Vendored,
                Some(index::Unpublished::NoVersion(SDK_VERSION.into()))
            )
        );

        let tmp = tempfile::tempdir().unwrap();
        let root = new("my-handler", tmp.path(), &Sdk::Vendored).unwrap();
        check_common(&root);
        let manifest = read(&root.join("Cargo.toml"));
        let dependency = format!(
            "\nmmmq-plugin-sdk = {{ path = \"mmmq-plugin-sdk\", version = \"{SDK_VERSION}\" }}\n"
        );
        assert!(manifest.contains(&dependency), "{manifest}");
        // The README says why the directory is there and how to switch to the registry.
        let readme = read(&root.join("README.md"));
        assert!(
            readme.contains("## The SDK in `mmmq-plugin-sdk/`")
                && readme.contains(&format!(
                    "mmmq-plugin-sdk {SDK_VERSION} was not on crates.io"
                ))
                && readme.contains(
                    "switch to it: delete the directory and the\n`path = \"mmmq-plugin-sdk\", ` in `Cargo.toml`."
                ),
            "{readme}"
        );
        for (path, text) in mmmq_plugin_sdk::sources::SOURCES {
            assert_eq!(&read(&root.join(vendor::DIR).join(path)), text, "{path}");
        }
        let sdk_manifest = read(&root.join(vendor::DIR).join("Cargo.toml"));
        assert!(
            sdk_manifest.contains(&format!("\nversion = \"{SDK_VERSION}\"\n")),
            "{sdk_manifest}"
        );
    }

    #[test]
    fn bad_names_existing_crates_and_wrong_sdk_paths_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", "1st", "My", "a b", "../x"] {
            assert!(matches!(
                new(bad, tmp.path(), &Sdk::Registry),
                Err(NewError::BadName(_))
            ));
        }
        new("x", tmp.path(), &Sdk::Registry).unwrap();
        assert!(matches!(
            new("x", tmp.path(), &Sdk::Vendored),
            Err(NewError::Exists(_))
        ));
        assert!(matches!(
            new("y", tmp.path(), &Sdk::Path(tmp.path().to_owned())),
            Err(NewError::NotAnSdk(_))
        ));
        assert!(!tmp.path().join("y").exists());
    }
}
