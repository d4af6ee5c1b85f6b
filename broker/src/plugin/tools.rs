//! `mmmq plugin check FILE` (`mmmq plugin new` is [`super::scaffold`]).

use std::io::Write;
use std::path::Path;

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
