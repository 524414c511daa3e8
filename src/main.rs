//! The `freqcap` command line.
//!
//! This release carries the library and the definition tools; `serve`, `replay`
//! and `simulate` arrive with the engine and the service.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use freqcap::model::{self, PolicyDef};

/// Frequency capping and rate limiting: exact limits, stacked decisions, reservations.
#[derive(Parser)]
#[command(
    name = "freqcap",
    version,
    about,
    after_help = "Examples:\n  freqcap validate policy.json\n  freqcap validate policy.toml\n  freqcap schemas --out schemas/"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a policy definition (JSON, or TOML by the .toml extension) and
    /// print it as stored, with any warnings, or the error naming the field.
    Validate {
        /// The policy file.
        file: PathBuf,
    },
    /// Write the JSON Schemas of the definitions into a folder.
    Schemas {
        /// The folder to write to.
        #[arg(long, default_value = "schemas")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("freqcap: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Validate { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let toml = file.extension().is_some_and(|e| e == "toml");
            let def: PolicyDef = if toml {
                model::from_toml(&text)
            } else {
                model::from_json(&text)
            }
            .map_err(|e| format!("{}: {e}", file.display()))?;
            let compiled = def
                .compile()
                .map_err(|e| format!("{}: {e}", file.display()))?;
            for w in &compiled.warnings {
                eprintln!("warning: {}: {}", w.field, w.message);
            }
            let out = serde_json::to_string_pretty(&def).map_err(|e| e.to_string())?;
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout(), "{out}");
            Ok(())
        }
        Command::Schemas { out } => {
            std::fs::create_dir_all(&out)
                .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
            for (name, text) in model::schemas() {
                let path = out.join(name);
                std::fs::write(&path, text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            Ok(())
        }
    }
}
