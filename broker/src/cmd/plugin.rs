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
    /// Writes a new plugin crate NAME that builds as it is: it depends on the SDK of this
    /// binary's version from crates.io when crates.io has it, else on the SDK's sources, which
    /// this binary carries, written into NAME/mmmq-plugin-sdk.
    New {
        /// Crate name (lower case, digits, '-', '_').
        name: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Write the SDK's sources into NAME/mmmq-plugin-sdk without asking crates.io.
        #[arg(long, conflicts_with = "sdk_path")]
        vendor_sdk: bool,
        /// Depend on the plugin-sdk directory of an mmmq checkout instead (for development of
        /// the SDK itself).
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
            vendor_sdk,
            sdk_path,
        } => new(&name, &dir, vendor_sdk, sdk_path),
    }
}

/// `mmmq plugin new`: picks the SDK (asking crates.io unless a flag decides), writes the crate
/// and says which SDK it took and why.
fn new(
    name: &str,
    dir: &std::path::Path,
    vendor_sdk: bool,
    sdk_path: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use mmmq::plugin::scaffold::{self, SDK_VERSION, Sdk, index, vendor};
    let (sdk, why) = match sdk_path {
        Some(path) => (Sdk::Path(path), None),
        None if vendor_sdk => (Sdk::Vendored, None),
        None => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let chosen = rt.block_on(scaffold::registry_or_vendored(&index::url()));
            // A DNS lookup still running on a blocking thread must not hold the command past
            // the index's timeout.
            rt.shutdown_background();
            chosen
        }
    };
    let root = scaffold::new(name, dir, &sdk)?;
    println!(
        "created {} (its README says how to build, check and deploy it)",
        root.display()
    );
    match (&sdk, why) {
        (Sdk::Registry, _) => println!("  SDK: mmmq-plugin-sdk {SDK_VERSION} from crates.io"),
        (Sdk::Vendored, why) => {
            let why = why.map_or("--vendor-sdk asked for it".to_owned(), |why| {
                why.to_string()
            });
            println!(
                "  SDK: mmmq-plugin-sdk {SDK_VERSION} from {}, written there because {why}\n       \
                 (the README says how to switch to crates.io once it is there)",
                root.join(vendor::DIR).display()
            );
        }
        (Sdk::Path(path), _) => println!("  SDK: {} (--sdk-path)", path.display()),
    }
    println!(
        "  cd {} && cargo test && cargo build --release --target wasm32-wasip2",
        root.display()
    );
    Ok(ExitCode::SUCCESS)
}
