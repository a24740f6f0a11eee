//! `execctl status`: the daemon's version, uptime, socket, containment, policy, counts and
//! limits, as `initialize` reports them.

use std::time::Duration;

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{Ctx, Host};
use super::errors::Res;
use super::output;
use super::ps::{no_operands, processes};

/// Limits that are byte sizes (printed as `4M`).
const SIZES: &[&str] = &[
    "maxMessage",
    "clientBuffer",
    "outputLimit",
    "maxOutputLimit",
    "maxOutputMemory",
    "stdinBuffer",
    "memoryMax",
];

/// A limit of `initialize` as execd's flag and its value as the flag takes it; `none`
/// for a limit that is not set.
fn limit_line(key: &str, v: &Value) -> (String, String) {
    let flag_of = |k: &str| format!("--{}", output::snake(k).replace('_', "-"));
    let (flag, unit) = if let Some(base) = key.strip_suffix("Ms") {
        (flag_of(base), "ms")
    } else if let Some(base) = key.strip_suffix("Percent") {
        (flag_of(base), "%")
    } else if SIZES.contains(&key) {
        (flag_of(key), "bytes")
    } else {
        (flag_of(key), "")
    };
    let value = match (v.as_u64(), unit) {
        (None, _) if v.is_null() => "none".to_string(),
        (None, _) => v.to_string(),
        (Some(n), "ms") => output::flag_duration(n),
        (Some(n), "bytes") => output::size(n),
        (Some(n), _) => n.to_string(),
    };
    (flag, value)
}

/// The policy and approvals, in a line.
fn policy_line(meta: &Value) -> String {
    let p = &meta["policy"];
    let file = match p["path"].as_str() {
        Some(path) if p["loaded"] == true => {
            let rules = output::counted(p["rules"].as_u64().unwrap_or(0), "rule", "rules");
            format!("{path} ({rules})")
        }
        _ => "none (every command is allowed)".to_string(),
    };
    let n = |k: &str| meta[k].as_u64().unwrap_or(0);
    format!(
        "{file}; {}, {} pending",
        output::counted(n("approvers"), "approver", "approvers"),
        output::counted(n("pendingApprovals"), "request", "requests")
    )
}

/// The sandbox in one line: the default and what the kernel offers.
fn sandbox_line(s: &Value) -> String {
    if s.is_null() {
        return "unknown (an execd without sandboxes)".into();
    }
    let abi = s["landlockAbi"].as_u64().unwrap_or(0);
    let workspaces: Vec<&str> = s["workspaces"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "default {}; Landlock ABI {abi}{}; signals {}; protect {}; workspaces {}",
        s["default"]["name"].as_str().unwrap_or("?"),
        if abi == 0 {
            " (none: sandboxes refused)"
        } else {
            ""
        },
        if s["signals"] == true {
            "scoped"
        } else {
            "by seccomp"
        },
        if s["protect"] == true {
            "yes"
        } else {
            "unavailable"
        },
        if workspaces.is_empty() {
            "none".to_string()
        } else {
            output::visible(&workspaces.join(" "))
        }
    )
}

/// `execctl status`.
pub fn status(ctx: &Ctx, p: &Args) -> Res<u8> {
    no_operands(p, "status")?;
    let mut c = ctx.connect()?;
    if p.has("--path") {
        // Asked once, so the path printed is one a daemon answers on; on another host,
        // the path there, as that daemon names it.
        let init = c.call("initialize", json!({}))?;
        let path = match &ctx.host {
            Host::Local(p) => p.display().to_string(),
            Host::Ssh(_) => init["_meta"]["execd"]["socket"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        output::print(&format!("{path}\n"))?;
        return Ok(0);
    }
    let init = c.call(
        "initialize",
        json!({"protocolVersion": 1, "clientInfo": {"name": "execctl", "version": env!("CARGO_PKG_VERSION")}}),
    )?;
    let all = processes(&mut c, None)?;
    let sessions = c.call("bash/sessions", json!({}))?;
    let meta = &init["_meta"]["execd"];
    let count = |kind: &str, running: bool| {
        all.iter()
            .filter(|x| x["kind"] == kind && (!running || x["state"] == "running"))
            .count()
    };
    let status = json!({
        "version": init["serverInfo"]["version"],
        "pid": meta["pid"],
        "socket": meta["socket"],
        "uptime_ms": meta["uptimeMs"],
        "upgrades": meta["upgrades"],
        "running": meta["running"],
        "clients": meta["clients"],
        "terminals": count("terminal", false),
        "running_terminals": count("terminal", true),
        "bash_commands": count("bash", false),
        "running_bash_commands": count("bash", true),
        "sessions": sessions.as_array().map_or(0, Vec::len),
        "output_memory": output::snake_keys(&meta["outputMemory"]),
        "policy": output::snake_keys(&meta["policy"]),
        "approvers": meta["approvers"],
        "pending_approvals": meta["pendingApprovals"],
        "containment": output::snake_keys(&meta["containment"]),
        "sandbox": output::snake_keys(&meta["sandbox"]),
        "descriptors": output::snake_keys(&meta["descriptors"]),
        "audit": meta["audit"],
        "limits": output::snake_keys(&init["limits"]),
    });
    if ctx.json {
        output::print_json(&status)?;
        return Ok(0);
    }
    let up = Duration::from_millis(meta["uptimeMs"].as_u64().unwrap_or(0));
    let mem = |k: &str| output::size(meta["outputMemory"][k].as_u64().unwrap_or(0));
    let containment = match meta["containment"]["detail"].as_str() {
        Some(detail) => format!(
            "{}\n            {detail}",
            meta["containment"]["kind"].as_str().unwrap_or("?")
        ),
        None => meta["containment"]["kind"]
            .as_str()
            .unwrap_or("?")
            .to_string(),
    };
    let uptime = match meta["upgrades"].as_u64().unwrap_or(0) {
        0 => output::human_duration(up),
        n => format!(
            "{} ({n} upgrade{} in place)",
            output::human_duration(up),
            if n == 1 { "" } else { "s" }
        ),
    };
    let rows = [
        ("uptime", uptime),
        (
            "running",
            format!(
                "{} yours ({}, {}); {} in all",
                count("terminal", true) + count("bash", true),
                output::counted(count("terminal", true) as u64, "terminal", "terminals"),
                output::counted(count("bash", true) as u64, "bash command", "bash commands"),
                status["running"]
            ),
        ),
        ("terminals", status["terminals"].to_string()),
        (
            "bash",
            format!(
                "{} in {}",
                output::counted(
                    status["bash_commands"].as_u64().unwrap_or(0),
                    "command",
                    "commands"
                ),
                output::counted(
                    status["sessions"].as_u64().unwrap_or(0),
                    "session",
                    "sessions"
                )
            ),
        ),
        ("clients", status["clients"].to_string()),
        (
            "output",
            format!(
                "{} of {} held ({} released to stay within it)",
                mem("used"),
                mem("budget"),
                mem("released")
            ),
        ),
        ("policy", policy_line(meta)),
        ("containment", containment),
        ("sandbox", sandbox_line(&meta["sandbox"])),
        (
            "descriptors",
            format!(
                "{} (room for about {} running terminals or {} bash commands)",
                meta["descriptors"]["limit"],
                meta["descriptors"]["terminals"],
                meta["descriptors"]["bashCommands"]
            ),
        ),
    ];
    let mut out = format!(
        "execd {} (pid {}) on {}\n",
        status["version"].as_str().unwrap_or("?"),
        status["pid"],
        status["socket"].as_str().unwrap_or("?"),
    );
    for (label, value) in rows {
        out.push_str(&format!("{label:<12}{value}\n"));
    }
    out.push_str("limits\n");
    let limits: Vec<(String, String)> = init["limits"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| limit_line(k, v))
        .collect();
    let width = limits.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
    for (flag, value) in limits {
        out.push_str(&format!("  {flag:<width$}  {value}\n"));
    }
    output::print(&out)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_flags() {
        assert_eq!(
            limit_line("clientBuffer", &json!(4 << 20)),
            ("--client-buffer".into(), "4M".into())
        );
        assert_eq!(
            limit_line("killGraceMs", &json!(2000)),
            ("--kill-grace".into(), "2s".into())
        );
        assert_eq!(
            limit_line("sessionIdleMs", &json!(3_600_000)),
            ("--session-idle".into(), "1h".into())
        );
        assert_eq!(
            limit_line("maxClients", &json!(1024)),
            ("--max-clients".into(), "1024".into())
        );
        assert_eq!(
            limit_line("memoryMax", &Value::Null),
            ("--memory-max".into(), "none".into())
        );
        assert_eq!(
            limit_line("cpuMaxPercent", &json!(50)),
            ("--cpu-max".into(), "50".into())
        );
        assert_eq!(
            limit_line("approvalTimeoutMs", &json!(60_000)),
            ("--approval-timeout".into(), "1m".into())
        );
    }
}
