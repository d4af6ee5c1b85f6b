//! The SDK this binary carries (`mmmq_plugin_sdk::sources`), as files to write beside a plugin:
//! its sources, and a standalone manifest in place of its own, which inherits from the mmmq
//! workspace.

/// The directory, inside the plugin crate, that the SDK is written to.
pub const DIR: &str = "mmmq-plugin-sdk";

/// The SDK's files, as (path inside the plugin crate, text).
pub fn files() -> Vec<(String, String)> {
    let manifest = include_str!("sdk-Cargo.toml.txt").replace("{sdk_version}", super::SDK_VERSION);
    std::iter::once(("Cargo.toml", manifest.as_str()))
        .chain(mmmq_plugin_sdk::sources::SOURCES.iter().copied())
        .map(|(path, text)| (format!("{DIR}/{path}"), text.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use serde_json::Value;

    use super::super::{SDK_VERSION, Sdk, new};
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// `cargo metadata --no-deps` of the manifest `manifest`: the package `mmmq-plugin-sdk`.
    fn sdk_package(manifest: &Path) -> Value {
        let out = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .arg("--manifest-path")
            .arg(manifest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
        let package = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "mmmq-plugin-sdk")
            .cloned();
        package.unwrap_or_else(|| panic!("no mmmq-plugin-sdk in {}", manifest.display()))
    }

    /// The written manifest builds the same crate as the workspace's: what cargo makes of the
    /// two (workspace inheritance resolved) agrees on every dependency with its version,
    /// features and target, on the features, and on the version, edition and toolchain.
    #[test]
    fn the_written_manifest_matches_the_workspace_sdk() {
        let tmp = tempfile::tempdir().unwrap();
        let root = new("p", tmp.path(), &Sdk::Vendored).unwrap();
        let written = sdk_package(&root.join(DIR).join("Cargo.toml"));
        let workspace = sdk_package(&workspace().join("plugin-sdk/Cargo.toml"));
        for field in [
            "dependencies",
            "features",
            "version",
            "edition",
            "rust_version",
        ] {
            assert_eq!(
                written[field], workspace[field],
                "{field} of scaffold/sdk-Cargo.toml.txt differs from plugin-sdk/Cargo.toml"
            );
        }
        assert_eq!(written["version"], SDK_VERSION);
    }

    /// Every file of the SDK but its manifest is carried: a new module in `plugin-sdk/src/` that
    /// `sources.rs` does not list would leave a written SDK that does not build.
    #[test]
    fn every_file_of_the_sdk_is_carried() {
        let sdk = workspace().join("plugin-sdk");
        let mut on_disk = vec!["README.md".to_owned()];
        for dir in ["src", "wit"] {
            for entry in std::fs::read_dir(sdk.join(dir)).unwrap() {
                let name = entry.unwrap().file_name();
                on_disk.push(format!("{dir}/{}", name.to_string_lossy()));
            }
        }
        on_disk.sort();
        let carried: Vec<_> = mmmq_plugin_sdk::sources::SOURCES
            .iter()
            .map(|(path, _)| path.to_string())
            .collect();
        assert_eq!(
            carried, on_disk,
            "plugin-sdk/src/sources.rs lists the files"
        );
    }
}
