//! Every way around the policy the red team found (issue 18, PROTOCOL.md 7.2), through
//! every front door: `bash/exec`, `terminal/create` with the line and with `bash -c LINE`,
//! and HTTP on the socket and over TCP with the token. The policy denies `rm`; every
//! line would delete the victim directory. Each must be refused (denied, or unparsed and
//! asked with no approver to ask) and the victim must survive it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::util::*;

const POLICY: &str = r#"{"default": "allow", "rules": [
    {"name": "no-rm", "pattern": ["rm"], "decision": "deny", "justification": "keeps files"}
]}"#;

/// The attack lines, `V` standing for the victim directory.
const LINES: &[&str] = &[
    "{fd}>/dev/null rm -rf V",
    "let 'a[$(rm -rf V)]'",
    "printf -v 'a[$(rm -rf V)]' x",
    "declare 'a[$(rm -rf V)]=1'",
    "test -v 'a[$(rm -rf V)]'",
    "[ -v 'a[$(rm -rf V)]' ]",
    "declare -i n; n='a[$(rm -rf V)]'",
    "mapfile -C 'rm -rf V #' -c 1 < /etc/hostname",
    "compgen -C 'rm -rf V' x",
    "hash -p /bin/rm ls; ls -rf V",
    "shopt -s expand_aliases; alias x='rm -rf'; eval 'x V'",
    "echo 'rm -rf V' > s.sh; . ./s.sh",
    "builtin eval 'rm -rf V'",
    "command eval 'rm -rf V'",
    "PS4='$(rm -rf V)'; set -x; true",
    "rbash -c 'rm -rf V'",
    "RANDOM='a[$(rm -rf V)]'",
    "BASH_CMDS[zz]=/bin/rm; zz -rf V",
    "echo 'rm -rf V' | bash",
    "sh -c 'true &>/dev/null rm -rf V'",
    "read 'a[$(rm -rf V)]' < /etc/hostname",
    "unset 'a[$(rm -rf V)]'",
];

/// A private free TCP port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Front {
    d: Daemon,
    port: u16,
    token: String,
    victim: std::path::PathBuf,
    cwd: TempDir,
}

impl Front {
    fn start() -> Front {
        let dir = TempDir::new();
        let policy = dir.path().join("policy.json");
        std::fs::write(&policy, POLICY).expect("policy");
        let token_file = dir.path().join("token");
        let token = "attack-test-token-0123456789abcdef".to_string();
        std::fs::write(&token_file, &token).expect("token");
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        let port = free_port();
        let socket = dir.path().join("execd.sock");
        let listen = format!("127.0.0.1:{port}");
        let mut flags = vec![
            "--policy",
            policy.to_str().expect("utf-8"),
            "--http-listen",
            &listen,
            "--http-token-file",
            token_file.to_str().expect("utf-8"),
        ];
        // A root daemon runs TCP requests as a user of its choosing.
        if running_as_root() {
            flags.extend(["--http-run-as", "nobody"]);
        }
        let d = Daemon::start_at(dir, socket, &flags);
        // Everyone may enter the directory and delete the victim: a line that ran would
        // delete it whoever it ran as.
        let cwd = TempDir::new();
        std::fs::set_permissions(cwd.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let victim = cwd.path().join("victim");
        let f = Front {
            d,
            port,
            token,
            victim,
            cwd,
        };
        f.plant();
        f
    }

    /// (Re)creates the victim directory with a file in it.
    fn plant(&self) {
        std::fs::create_dir_all(&self.victim).expect("victim");
        std::fs::set_permissions(&self.victim, std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        std::fs::write(self.victim.join("precious"), b"x").expect("precious");
    }

    fn line(&self, template: &str) -> String {
        template.replace('V', &format!("'{}'", self.victim.display()))
    }

    /// The victim is still there after `what`.
    #[track_caller]
    fn survived(&self, what: &str) {
        assert!(
            self.victim.join("precious").exists(),
            "the victim was deleted by {what}"
        );
    }

    /// An HTTP exchange of `POST /v1/bash/exec` with `body`: the status line.
    fn post(&self, stream: &mut (impl Read + Write), body: &Value, token: bool) -> String {
        let body = body.to_string();
        let auth = if token {
            format!("Authorization: Bearer {}\r\n", self.token)
        } else {
            String::new()
        };
        write!(
            stream,
            "POST /v1/bash/exec HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write the request");
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply.lines().next().unwrap_or_default().to_string()
    }
}

/// The request was refused by the gate: denied, or not approved (no approver to ask).
#[track_caller]
fn refused(code: i64, what: &str) {
    assert!(
        code == -32005 || code == -32006,
        "{what} was not refused by the gate: {code}"
    );
}

#[test]
fn every_attack_is_refused_through_every_front_door_and_the_victim_survives() {
    let f = Front::start();
    let mut c = f.d.client();
    let cwd = f.cwd.path().display().to_string();
    for template in LINES {
        let line = f.line(template);
        // bash/exec over JSON-RPC.
        let (code, _, _) = err(
            &mut c,
            "bash/exec",
            json!({"command": line, "exec_dir": cwd}),
        );
        refused(code, &format!("bash/exec {line:?}"));
        f.survived(&format!("bash/exec {line:?}"));
        // terminal/create with the line, and with `bash -c LINE`.
        let (code, _, _) = err(
            &mut c,
            "terminal/create",
            json!({"sessionId": "s", "command": line, "cwd": cwd}),
        );
        refused(code, &format!("terminal/create {line:?}"));
        f.survived(&format!("terminal/create {line:?}"));
        let (code, _, _) = err(
            &mut c,
            "terminal/create",
            json!({"sessionId": "s", "command": "bash", "args": ["-c", line], "cwd": cwd}),
        );
        refused(code, &format!("terminal/create bash -c {line:?}"));
        f.survived(&format!("terminal/create bash -c {line:?}"));
        // HTTP on the Unix socket, and over TCP with the token: 403.
        let body = json!({"command": line, "exec_dir": cwd});
        let mut s = UnixStream::connect(&f.d.socket).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let status = f.post(&mut s, &body, false);
        assert_eq!(status, "HTTP/1.1 403 Forbidden", "socket HTTP {line:?}");
        f.survived(&format!("HTTP on the socket {line:?}"));
        let mut t = TcpStream::connect(("127.0.0.1", f.port)).expect("connect TCP");
        t.set_read_timeout(Some(WAIT)).expect("timeout");
        let status = f.post(&mut t, &body, true);
        assert_eq!(status, "HTTP/1.1 403 Forbidden", "TCP HTTP {line:?}");
        f.survived(&format!("HTTP over TCP {line:?}"));
    }
    // In a batch too.
    let batch: Vec<Value> = LINES
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"jsonrpc": "2.0", "id": i, "method": "bash/exec",
                   "params": {"command": f.line(t), "exec_dir": cwd}})
        })
        .collect();
    c.send_line(Value::Array(batch).to_string().as_bytes())
        .expect("send the batch");
    let answers = c.read_message(Some(WAIT)).expect("the batch's answers");
    let answers = answers.as_array().expect("an array of answers");
    assert_eq!(answers.len(), LINES.len());
    for a in answers {
        let code = a["error"]["code"].as_i64().unwrap_or(0);
        refused(code, &format!("a batch entry: {a}"));
    }
    f.survived("a batch");
    // The policy's own check says the same: each line is denied or unparsed, never allowed.
    for template in LINES {
        let line = f.line(template);
        let v = ok(&mut c, "policy/check", json!({"command": line}));
        assert_ne!(v["decision"], "allow", "policy/check allows {line:?}: {v}");
    }
    // And a plain `rm` is denied by its rule.
    let (code, message, _) = err(&mut c, "bash/exec", json!({"command": f.line("rm -rf V")}));
    assert_eq!(code, -32005, "{message}");
    assert!(message.contains("no-rm"), "{message}");
    f.survived("rm -rf V");
}

/// A request whose environment changes what runs (`BASH_ENV` naming a script) is unparsed
/// whatever its line, so it is never admitted unasked.
#[test]
fn a_bash_env_in_the_request_never_runs_unasked() {
    let f = Front::start();
    let evil = f.cwd.path().join("evil.sh");
    std::fs::write(&evil, f.line("rm -rf V\n")).expect("evil.sh");
    let mut c = f.d.client();
    let (code, _, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "env": {"BASH_ENV": evil}}),
    );
    refused(code, "bash/exec with BASH_ENV");
    let (code, _, _) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "bash", "args": ["-c", "true"],
               "env": [{"name": "BASH_ENV", "value": evil.display().to_string()}]}),
    );
    refused(code, "terminal/create with BASH_ENV");
    f.survived("BASH_ENV");
    assert!(Path::new(&evil).exists());
}
