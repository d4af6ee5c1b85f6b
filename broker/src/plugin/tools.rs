//! `mmmq plugin check FILE` and `mmmq plugin new NAME`.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::runtime::{PluginEngine, PluginError};

/// Checks that `file` is a component mmmq can run; prints what it found. `Ok(false)` when it is not
/// usable (the reason is printed).
pub fn check(file: &Path, out: &mut dyn Write) -> std::io::Result<bool> {
    let verdict = (|| {
        let bytes = std::fs::read(file).map_err(|e| PluginError::Read {
            path: file.display().to_string(),
            reason: e.to_string(),
        })?;
        let engine = PluginEngine::new()?;
        engine.compile(&bytes)
    })();
    match verdict {
        Ok(c) => {
            writeln!(out, "{}: compatible mmmq plugin", file.display())?;
            writeln!(out, "  world:    {} (exports handle)", c.world)?;
            writeln!(
                out,
                "  version:  {} (as GET /mmmq/dispatchers shows it)",
                c.version
            )?;
            writeln!(out, "  size:     {} bytes", c.size)?;
            writeln!(out, "  imports:  {}", c.imports.join(", "))?;
            Ok(true)
        }
        Err(e) => {
            writeln!(out, "{}: not usable: {e}", file.display())?;
            Ok(false)
        }
    }
}

/// The plugin SDK of the source tree this binary was built from, if it is still there.
pub fn default_sdk_path() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk");
    p.join("Cargo.toml")
        .exists()
        .then(|| p.canonicalize().unwrap_or(p))
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
    /// No SDK to depend on.
    #[error(
        "cannot find the plugin SDK; pass --sdk-path to the mmmq checkout's plugin-sdk directory"
    )]
    NoSdk,
    /// Writing failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// Writes a plugin crate `name` under `dir` that builds as it is.
pub fn new(name: &str, dir: &Path, sdk: Option<&Path>) -> Result<PathBuf, NewError> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(NewError::BadName(name.to_owned()));
    }
    let sdk = match sdk {
        Some(p) => p.to_owned(),
        None => default_sdk_path().ok_or(NewError::NoSdk)?,
    };
    let root = dir.join(name);
    if root.exists() {
        return Err(NewError::Exists(root));
    }
    let lib = name.replace('-', "_");
    let files = [
        (
            "Cargo.toml",
            format!(
                r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
mmmq-plugin-sdk = {{ path = "{sdk}" }}
serde = {{ version = "1", features = ["derive"] }}

[profile.release]
opt-level = "s"
strip = true
"#,
                sdk = sdk.display()
            ),
        ),
        (
            "src/lib.rs",
            r##"//! An mmmq message handler.

use mmmq_plugin_sdk::{Message, Verdict, info};
use serde::Deserialize;

/// What this handler expects in a message's content.
#[derive(Debug, Deserialize)]
pub struct Event {
    /// An id every event carries.
    pub id: u64,
}

/// Called once per message, in offset order per partition. `Verdict::Nack` makes the broker resend
/// the message (then dead-letter it), `Verdict::RetryAfter(ms)` resend it after a while, and
/// `Verdict::DeadLetter(reason)` dead-letter it at once. `mmmq_plugin_sdk::config("key")` reads
/// the dispatcher's `plugin.config`.
pub fn handle(msg: Message) -> Verdict {
    match msg.json::<Event>() {
        Ok(event) => {
            info!("{} offset {}: event {}", msg.topic, msg.offset, event.id);
            Verdict::Ack
        }
        // Content that is not an event never will be: no point in resending it.
        Err(e) => Verdict::DeadLetter(format!("not an event: {e}")),
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_acked_and_the_rest_dead_lettered() {
        assert_eq!(handle(Message::new("events", r#"{"id": 7}"#)), Verdict::Ack);
        assert!(matches!(
            handle(Message::new("events", r#"{"name": "x"}"#)),
            Verdict::DeadLetter(_)
        ));
    }
}
"##
            .to_owned(),
        ),
        (
            "README.md",
            format!(
                "# {name}\n\nAn mmmq WebAssembly handler.\n\n```sh\ncargo test                                          # the handler, natively\ncargo build --release --target wasm32-wasip2        # the component\nmmmq plugin check target/wasm32-wasip2/release/{lib}.wasm\ncp target/wasm32-wasip2/release/{lib}.wasm $MMMQ_ROOT_DIR/plugins/   # deploy or hot-reload\n```\n\nand in `dispatchers.json`:\n\n```json\n{{\"consumerId\": \"{name}\", \"pattern\": \"**\", \"plugin\": {{\"path\": \"plugins/{lib}.wasm\"}}}}\n```\n"
            ),
        ),
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
