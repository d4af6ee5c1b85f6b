//! `mmmq plugin new NAME` (docs/plugins.md, "Write, deploy and change a handler"): a plugin crate that
//! builds as it is, anywhere — it depends on the SDK published with the version of this binary,
//! or on a checkout's `plugin-sdk/` with `--sdk-path`.

use std::path::{Path, PathBuf};

use super::worlds::WORLD_V2;

/// The SDK version a scaffold depends on: the SDK and the broker are released together, with the
/// workspace's one version, so this binary serves exactly the world that SDK builds.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where a scaffold takes the SDK from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sdk {
    /// `mmmq-plugin-sdk = "{SDK_VERSION}"` from crates.io (the default).
    Registry,
    /// A path dependency on an mmmq checkout's `plugin-sdk` directory, for development.
    Path(PathBuf),
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
    let fill = |template: &str| {
        template
            .replace("{name}", name)
            .replace("{lib}", &name.replace('-', "_"))
            .replace("{world}", WORLD_V2)
            .replace("{sdk_version}", SDK_VERSION)
            .replace("{sdk}", &sdk_dependency)
    };
    let files = [
        ("Cargo.toml", fill(include_str!("scaffold/Cargo.toml.txt"))),
        ("src/lib.rs", include_str!("scaffold/lib.rs.txt").to_owned()),
        ("README.md", fill(include_str!("scaffold/README.md.txt"))),
        (".gitignore", "/target\n".to_owned()),
    ];
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

    #[test]
    fn the_default_scaffold_depends_on_the_sdk_of_this_version() {
        let tmp = tempfile::tempdir().unwrap();
        let root = new("my-handler", tmp.path(), &Sdk::Registry).unwrap();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("mmmq-plugin-sdk = \"{SDK_VERSION}\"\n")),
            "{manifest}"
        );
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        for command in [
            "cargo build --release --target wasm32-wasip2",
            "mmmq plugin check target/wasm32-wasip2/release/my_handler.wasm",
            "mmmq plugin deploy target/wasm32-wasip2/release/my_handler.wasm --name my-handler",
            "mmmq reload",
        ] {
            assert!(readme.contains(command), "{command} in\n{readme}");
        }
        for placeholder in ["{name}", "{lib}", "{world}", "{sdk_version}", "{sdk}"] {
            assert!(!readme.contains(placeholder) && !manifest.contains(placeholder));
        }
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
            new("x", tmp.path(), &Sdk::Registry),
            Err(NewError::Exists(_))
        ));
        assert!(matches!(
            new("y", tmp.path(), &Sdk::Path(tmp.path().to_owned())),
            Err(NewError::NotAnSdk(_))
        ));
        assert!(!tmp.path().join("y").exists());
    }
}
