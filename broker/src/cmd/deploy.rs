//! `mmmq plugin deploy|list|rollback|activate` (docs/plugins.md, "Deploying plugins by API"): deployed plugins
//! and their versions on a running broker.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use mmmq_client::Admin;

use super::{BrokerArg, client};

/// The deploy commands of `mmmq plugin`.
#[derive(Subcommand)]
pub enum DeployCommand {
    /// Deploy a component as the new current version of plugin NAME: dispatchers whose
    /// `plugin.name` is NAME switch to it before this returns.
    Deploy {
        /// The `.wasm` component.
        file: PathBuf,
        /// The plugin's name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Deployed plugins: current version, kept versions, the dispatchers that run each.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Make the version deployed before the current one current.
    Rollback {
        /// The plugin's name.
        name: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Make a kept version current.
    Activate {
        /// The plugin's name.
        name: String,
        /// The version (16 hex digits, as `mmmq plugin list` shows).
        version: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

/// Runs one deploy command.
pub fn run(cmd: DeployCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let out = &mut std::io::stdout();
    let admin = |b: &BrokerArg| -> anyhow::Result<Admin> { Ok(b.conn().admin()?) };
    let deployed = match cmd {
        DeployCommand::Deploy { file, name, broker } => {
            let bytes = std::fs::read(&file)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            rt.block_on(admin(&broker)?.deploy_plugin(&name, bytes))?
        }
        DeployCommand::Rollback { name, broker } => {
            rt.block_on(admin(&broker)?.rollback_plugin(&name))?
        }
        DeployCommand::Activate {
            name,
            version,
            broker,
        } => rt.block_on(admin(&broker)?.activate_plugin(&name, &version))?,
        DeployCommand::List { json, broker } => {
            let all = rt.block_on(admin(&broker)?.plugins())?;
            if client::print_json(json, &all, out)? {
                return Ok(ExitCode::SUCCESS);
            }
            let mut rows = Vec::new();
            for p in &all {
                for v in p.versions.iter().rev() {
                    let current = if v.version == p.current { "*" } else { "" };
                    rows.push(vec![
                        p.name.clone(),
                        format!("{current}{}", v.version),
                        v.world.clone(),
                        v.bytes.to_string(),
                        v.deployed_at.to_string(),
                        p.used_by.join(","),
                    ]);
                }
            }
            client::table(
                &[
                    "NAME",
                    "VERSION",
                    "WORLD",
                    "BYTES",
                    "DEPLOYED_AT_MS",
                    "USED_BY",
                ],
                &rows,
                out,
            )?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    writeln!(
        out,
        "{} is now at {} ({})",
        deployed.name, deployed.version, deployed.world
    )?;
    Ok(ExitCode::SUCCESS)
}
