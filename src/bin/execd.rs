//! execd: flags -> Config -> server::run().

use std::process::ExitCode;

use execd::config::{parse_args, Invocation, USAGE};
use execd::server::Server;

fn main() -> ExitCode {
    let invocation = match parse_args(std::env::args().skip(1)) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("execd: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match invocation {
        Invocation::Help => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Invocation::Version => {
            println!("execd {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Invocation::CheckPolicy(path) => {
            return match execd::policy::Policy::load(&path) {
                Ok(p) => {
                    println!(
                        "{}: {} rule(s), every example agrees with its rule",
                        path.display(),
                        p.rule_count()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("execd: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Invocation::Run(cfg) => cfg,
    };
    let server = match Server::new(*cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("execd: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("execd: event loop failed: {e}");
            ExitCode::FAILURE
        }
    }
}
