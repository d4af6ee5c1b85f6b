//! `mmmq completions SHELL` and `mmmq man`: generated from the command line's own definition
//! (`clap_complete`, `clap_mangen`), so they cannot drift from the flags.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;

use super::Cli;

/// `mmmq completions`.
#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// `mmmq man`.
#[derive(clap::Args)]
pub struct ManArgs {
    /// Write `mmmq.1` and a page per subcommand (`mmmq-serve.1`, `mmmq-plugin-new.1`, …) into
    /// this directory instead of printing `mmmq.1`.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Prints the completion script for a shell.
pub fn completions(args: &CompletionsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // Generated into memory first: `clap_complete` panics on a write error, and `| head` is
    // normal use.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "mmmq", &mut script);
    print(out, &script)
}

/// Writes `bytes`; a reader that went away (`| head`) is not an error.
fn print(out: &mut dyn Write, bytes: &[u8]) -> anyhow::Result<()> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Prints the man page, or writes every page into a directory.
pub fn man(args: &ManArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cmd = Cli::command();
    match &args.out_dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page)?;
            print(out, &page)?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            writeln!(out, "man pages written to {}", dir.display())?;
        }
    }
    Ok(())
}
