//! `execctl upgrade [--binary PATH]`: upgrades the daemon in place (PROTOCOL 13) and says
//! how it went in one line: exit 0 once the new image serves, or the reason and exit 1
//! (the old image then serves on, as before).

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{Ctx, Host};
use super::errors::{detail, Fail, Res};
use super::output;
use super::ps::no_operands;

/// The exit status of a refused upgrade.
const REFUSED: u8 = 1;

/// `execctl upgrade`.
pub fn upgrade(ctx: &Ctx, p: &Args) -> Res<u8> {
    no_operands(p, "upgrade")?;
    let binary = match p.value("--binary") {
        None => None,
        Some(b) if b.starts_with('/') => Some(b.to_string()),
        // A relative path means this directory, on this host only.
        Some(b) => match &ctx.host {
            Host::Local(_) => {
                let cwd =
                    std::env::current_dir().map_err(|e| Fail::new(format!("--binary {b}: {e}")))?;
                Some(cwd.join(b).display().to_string())
            }
            Host::Ssh(_) => {
                return Err(Fail::usage(format!(
                    "--binary {b}: give the absolute path of the new execd on the daemon's host"
                )))
            }
        },
    };
    let params = match &binary {
        Some(b) => json!({ "binary": b }),
        None => json!({}),
    };
    let mut c = ctx.connect()?;
    match c.call("daemon/upgrade", params) {
        Ok(r) => {
            if ctx.json {
                output::print_json_line(&r)?;
            } else {
                output::print(&format!("{}\n", said(&r)))?;
            }
            Ok(0)
        }
        Err(e) => {
            let message = match detail(&e) {
                // What execd runs never upgrades it (PROTOCOL 7.3): its own words say so.
                Some(d)
                    if d.code == -32002
                        && d.data
                            .as_ref()
                            .is_some_and(|v| v["method"] == "daemon/upgrade") =>
                {
                    format!("upgrade refused: {}", d.message)
                }
                Some(d) if d.code == -32002 => {
                    "upgrade refused: only execd's own user and root may upgrade it".to_string()
                }
                Some(d) => d.message,
                None => Fail::from(e).message,
            };
            Err(Fail::new(message).with_code(REFUSED))
        }
    }
}

/// The answer of `daemon/upgrade` in a line.
fn said(r: &Value) -> String {
    let s = |k: &str| r[k].as_str().unwrap_or("?").to_string();
    format!(
        "upgraded execd {} -> {} in place (upgrade {}, paused {:.1} ms)",
        s("from"),
        s("to"),
        r["upgrades"].as_u64().unwrap_or(0),
        r["pause_ms"].as_f64().unwrap_or(0.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_one_line() {
        let line = said(&json!({"from": "0.1.0", "to": "0.2.0", "upgrades": 3, "pause_ms": 12.34}));
        assert_eq!(
            line,
            "upgraded execd 0.1.0 -> 0.2.0 in place (upgrade 3, paused 12.3 ms)"
        );
        assert!(!line.contains('\n'));
    }
}
