//! The `flotilla` binary: one command-line entry point for every part of the product.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use flotilla_sim::{Scenario, render, simulate};

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Staged, predictable upgrades for fleets of Kubernetes clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file in virtual time: a fleet, a catalog, a strategy, actions.
    Simulate {
        /// The scenario YAML file (format: ../shared/conformance/README.md).
        scenario: PathBuf,
        /// Print the result document (run, clusters, events) as JSON.
        #[arg(long, conflicts_with = "check")]
        json: bool,
        /// Compare the result with the scenario's `expect`; exit 1 and say what differs.
        #[arg(long)]
        check: bool,
    },
}

/// The run's name: the file's stem, made into a valid resource name.
fn run_name(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    let mut name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(50)
        .collect();
    name = name.trim_end_matches('-').to_string();
    if name.is_empty() { "run".into() } else { name }
}

fn simulate_command(path: &Path, json: bool, check: bool) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read scenario {}", path.display()))?;
    let scenario = Scenario::parse(&run_name(path), &text)
        .with_context(|| format!("scenario {}", path.display()))?;
    let result = simulate(&scenario);
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(ExitCode::SUCCESS);
    }
    if check {
        let document = serde_json::to_value(&result)?;
        let differences = flotilla_sim::check::check(
            scenario.expect.as_ref().unwrap_or(&serde_json::Value::Null),
            &document,
        );
        if differences.is_empty() {
            println!("ok");
            return Ok(ExitCode::SUCCESS);
        }
        for d in differences {
            println!("{d}");
        }
        return Ok(ExitCode::from(1));
    }
    print!("{}", render::report(&scenario.description, &result));
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Simulate {
            scenario,
            json,
            check,
        } => simulate_command(&scenario, json, check),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flotilla: {e:#}");
            ExitCode::from(2)
        }
    }
}
