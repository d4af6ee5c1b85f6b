//! `mmmq plugin …`: tools for WebAssembly handlers (docs/plugins.md, "WebAssembly handlers").

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{BrokerArg, client, deploy, replay};

#[derive(Subcommand)]
pub enum PluginCommand {
    #[command(flatten)]
    Deployed(deploy::DeployCommand),
    /// Is FILE a component mmmq can run? Prints its world, version and imports; exits 1 if not.
    Check {
        /// The `.wasm` file.
        file: PathBuf,
    },
    /// Runs the version of a plugin dispatcher's plugin that handled a stored message on it,
    /// offline, with the dispatcher's limits and config: verdict, emits, logs, a fault's backtrace.
    Replay(replay::ReplayArgs),
    /// Writes a new plugin crate NAME that builds as it is.
    New {
        /// Crate name (lower case, digits, '-', '_').
        name: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Depend on the plugin-sdk directory of an mmmq checkout instead of the published SDK of
        /// this binary's version (for development of the SDK itself).
        #[arg(long, value_name = "DIR")]
        sdk_path: Option<PathBuf>,
    },
    /// What a plugin dispatcher's plugin logged (`__logs.CONSUMER`): level, the message it was
    /// handling, the plugin version, the line.
    Logs {
        /// The dispatcher's consumerId.
        consumer: String,
        /// First offset of the log topic.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Keep waiting for new lines.
        #[arg(long)]
        follow: bool,
        /// One JSON envelope per line instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

/// Runs one `mmmq plugin` command.
pub fn run(what: PluginCommand) -> anyhow::Result<ExitCode> {
    match what {
        PluginCommand::Deployed(cmd) => deploy::run(cmd),
        PluginCommand::Replay(args) => replay::run(args),
        PluginCommand::Check { file } => {
            let ok = mmmq::plugin::tools::check(&file, &mut std::io::stdout())?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        PluginCommand::Logs {
            consumer,
            from,
            follow,
            json,
            broker,
        } => {
            let rt = tokio::runtime::Runtime::new()?;
            let topic = format!("__logs.{consumer}");
            let format = if json {
                client::envelope_line
            } else {
                client::plugin_log_line
            };
            let tailed = rt.block_on(client::tail_with(
                &broker.conn(),
                (&topic, 0),
                (from, follow),
                &mut std::io::stdout(),
                format,
            ));
            match tailed {
                Err(client::CliError::Client(mmmq_client::ClientError::NoSuchTopic(_))) => {
                    println!("{consumer:?} has logged nothing yet");
                    Ok(ExitCode::SUCCESS)
                }
                other => other.map(|()| ExitCode::SUCCESS).map_err(Into::into),
            }
        }
        PluginCommand::New {
            name,
            dir,
            sdk_path,
        } => {
            use mmmq::plugin::scaffold::{self, Sdk};
            let sdk = sdk_path.map_or(Sdk::Registry, Sdk::Path);
            let root = scaffold::new(&name, &dir, &sdk)?;
            println!(
                "created {} (its README says how to build, check and deploy it)",
                root.display()
            );
            println!(
                "  cd {} && cargo test && cargo build --release --target wasm32-wasip2",
                root.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
