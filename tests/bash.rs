//! The bash pipe API (`bash/*`, PROTOCOL.md section 5) end to end against the real daemon.
//!
//! Every `bash/*` result is checked against the published object schemas
//! (`tests/data/bash-openapi-components.json`, a copy of the API's OpenAPI components) and
//! may carry extra fields only where section 5 adds them (`signal`, `stdout_skipped`,
//! `stderr_skipped`, `written`).

use crate::util::*;

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The published OpenAPI components of the bash pipe API.
const COMPONENTS: &str = include_str!("data/bash-openapi-components.json");

/// Fields sections 5 and 12 add to the published objects.
const EXTRA_FIELDS: [&str; 7] = [
    "signal",
    "stdout_skipped",
    "stderr_skipped",
    "written",
    // Section 12: a command in a terminal, its screen, and waiting for input.
    "tty",
    "screen",
    "waiting_for_input",
];

/// The result objects the tests check, by schema name.
const RESULT_SCHEMAS: [&str; 4] = [
    "BashExecResult",
    "BashOutputResult",
    "BashCommandInfo",
    "BashSessionInfo",
];

struct Schemas {
    /// `components.schemas`.
    defs: Value,
    validators: HashMap<&'static str, jsonschema::Validator>,
}

fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(|| {
        let doc: Value = serde_json::from_str(COMPONENTS).expect("components JSON parses");
        let components = doc["components"].clone();
        let validators = RESULT_SCHEMAS
            .iter()
            .map(|name| {
                // A root that keeps `components`, so `#/components/schemas/X` refs resolve.
                let root = json!({
                    "$ref": format!("#/components/schemas/{name}"),
                    "components": components,
                });
                let v = jsonschema::options()
                    .build(&root)
                    .unwrap_or_else(|e| panic!("schema {name} compiles: {e}"));
                (*name, v)
            })
            .collect();
        Schemas {
            defs: components["schemas"].clone(),
            validators,
        }
    })
}

/// Checks `v` against published schema `name`, and that its keys are the schema's
/// properties plus only section 5's additions.
#[track_caller]
fn conform(name: &str, v: &Value) {
    let s = schemas();
    let validator = &s.validators[name];
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{name} does not match its schema: {errors:?}\n{v}"
    );
    let props = s.defs[name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has properties"));
    let obj = v.as_object().expect("an object");
    for key in obj.keys() {
        assert!(
            props.contains_key(key) || EXTRA_FIELDS.contains(&key.as_str()),
            "{name} carries unexpected field {key:?}: {v}"
        );
    }
    if let Some(sig) = obj.get("signal") {
        let sig = sig
            .as_str()
            .unwrap_or_else(|| panic!("signal is a string: {v}"));
        assert!(sig.starts_with("SIG"), "signal names a signal: {v}");
        assert_eq!(
            obj.get("exit_code"),
            Some(&Value::Null),
            "a signal means exit_code null: {v}"
        );
    }
    for skipped in ["stdout_skipped", "stderr_skipped"] {
        if let Some(n) = obj.get(skipped) {
            assert!(
                n.as_u64().is_some_and(|n| n > 0),
                "{skipped} is absent when 0: {v}"
            );
        }
    }
    if name == "BashOutputResult" {
        if let Some(cmd) = obj.get("command").filter(|c| !c.is_null()) {
            conform("BashCommandInfo", cmd);
        }
    }
    if name == "BashSessionInfo" {
        for ts in ["created_at", "last_used_at"] {
            let t = v[ts].as_str().expect("timestamp string");
            assert!(is_rfc3339_utc(t), "{ts} is RFC 3339 UTC ending in Z: {t:?}");
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` with plausible field values.
fn is_rfc3339_utc(t: &str) -> bool {
    let b = t.as_bytes();
    if b.len() < 20 || !t.ends_with('Z') {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = t.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return false;
    };
    let seps = b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':';
    let frac = &t[19..t.len() - 1];
    let frac_ok = frac.is_empty()
        || (frac.len() > 1
            && frac.starts_with('.')
            && frac[1..].bytes().all(|c| c.is_ascii_digit()));
    seps && frac_ok
        && y >= 2000
        && (1..=12).contains(&mo)
        && (1..=31).contains(&d)
        && h < 24
        && mi < 60
        && s < 61
}

// ---- typed calls -------------------------------------------------------------------

#[track_caller]
fn exec(c: &mut Client, params: Value) -> Value {
    let r = ok(c, "bash/exec", params);
    conform("BashExecResult", &r);
    r
}

#[track_caller]
fn output(c: &mut Client, params: Value) -> Value {
    let r = ok(c, "bash/output", params);
    conform("BashOutputResult", &r);
    r
}

#[track_caller]
fn kill(c: &mut Client, params: Value) -> Value {
    let r = ok(c, "bash/kill", params);
    conform("BashCommandInfo", &r);
    r
}

/// `bash/write`; checks the result is exactly `{written: n}` and returns `n`.
#[track_caller]
fn write(c: &mut Client, params: Value) -> u64 {
    let r = ok(c, "bash/write", params);
    let obj = r.as_object().expect("write result is an object");
    assert_eq!(
        obj.len(),
        1,
        "bash/write result is exactly {{written}}: {r}"
    );
    obj["written"].as_u64().expect("written is a count")
}

#[track_caller]
fn sessions(c: &mut Client) -> Vec<Value> {
    let r = ok(c, "bash/sessions", json!({}));
    let list = r
        .as_array()
        .unwrap_or_else(|| panic!("bash/sessions is an array: {r}"));
    for s in list {
        conform("BashSessionInfo", s);
    }
    list.clone()
}

#[track_caller]
fn create_session(c: &mut Client, params: Value) -> Value {
    let r = ok(c, "bash/sessions/create", params);
    conform("BashSessionInfo", &r);
    r
}

#[track_caller]
fn close_session(c: &mut Client, id: &str) {
    let r = ok(c, "bash/sessions/close", json!({"session_id": id}));
    assert_eq!(r, json!({}), "bash/sessions/close answers {{}}");
}

fn session_ids(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|s| s["session_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn find_session<'a>(list: &'a [Value], id: &str) -> Option<&'a Value> {
    list.iter().find(|s| s["session_id"] == id)
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is a string in {v}"))
}

/// What `bash/output` with `wait` gathered until the command ended.
struct Gathered {
    stdout: String,
    stderr: String,
    /// The final `command` object.
    command: Value,
    offset: u64,
    stderr_offset: u64,
    calls: usize,
}

/// Long-polls `bash/output` from the given offsets, following the returned offsets, until
/// the command has ended; bounded by `WAIT`.
#[track_caller]
fn gather(c: &mut Client, session: &str, command_id: &str, from: (u64, u64)) -> Gathered {
    let deadline = Instant::now() + WAIT;
    let mut g = Gathered {
        stdout: String::new(),
        stderr: String::new(),
        command: Value::Null,
        offset: from.0,
        stderr_offset: from.1,
        calls: 0,
    };
    loop {
        assert!(
            Instant::now() < deadline,
            "{command_id} did not end within {WAIT:?}"
        );
        let r = output(
            c,
            json!({"session_id": session, "command_id": command_id, "offset": g.offset,
                   "stderr_offset": g.stderr_offset, "wait": true, "wait_timeout": 5}),
        );
        g.calls += 1;
        assert_eq!(r["session_id"], session);
        assert!(r.get("stdout_skipped").is_none(), "nothing dropped: {r}");
        g.stdout.push_str(str_of(&r, "stdout"));
        g.stderr.push_str(str_of(&r, "stderr"));
        g.offset = r["offset"].as_u64().expect("offset");
        g.stderr_offset = r["stderr_offset"].as_u64().expect("stderr_offset");
        g.command = r["command"].clone();
        assert_eq!(g.command["command_id"], command_id);
        if g.command["status"] != "running" {
            return g;
        }
    }
}

/// Runs `line` with bash locally and returns its stdout.
fn local_stdout(line: &str) -> Vec<u8> {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(line)
        .output()
        .expect("run bash locally");
    assert!(out.status.success(), "local {line:?} failed");
    out.stdout
}

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p)
        .expect("canonicalize")
        .display()
        .to_string()
}

#[track_caller]
fn rpc_err(c: &mut Client, method: &str, params: Value) -> (i64, Value) {
    let (code, _msg, data) = err(c, method, params);
    (code, data.unwrap_or(Value::Null))
}

// ---- exec --------------------------------------------------------------------------

#[test]
fn sync_exec_separates_streams_and_reports_the_exit_code() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(&mut c, json!({"command": "echo out; echo err >&2; exit 4"}));
    assert_eq!(r["status"], "completed");
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["exit_code"], 4);
    assert_eq!(r["offset"], 4);
    assert_eq!(r["stderr_offset"], 4);
    assert_eq!(r["command"], "echo out; echo err >&2; exit 4");
    assert!(r.get("signal").is_none(), "no signal for a plain exit: {r}");
    // A plain word still runs through the shell (section 5: always `SHELL -c`).
    let r = exec(&mut c, json!({"command": "echo $((6*7))"}));
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["exit_code"], 0);
}

#[test]
fn soft_timeout_answers_running_and_the_command_goes_on() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "sleep 1; echo done", "timeout": 0.2}),
    );
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(r["stdout"], "");
    let session = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let from = (
        r["offset"].as_u64().unwrap(),
        r["stderr_offset"].as_u64().unwrap(),
    );
    let g = gather(&mut c, &session, &id, from);
    assert_eq!(g.stdout, "done\n");
    assert_eq!(g.stderr, "");
    assert_eq!(g.command["status"], "completed");
    assert_eq!(g.command["exit_code"], 0);
    assert_eq!(g.command["command"], "sleep 1; echo done");
    assert_eq!((g.offset, g.stderr_offset), (5, 0));
}

#[test]
fn hard_timeout_kills_the_whole_group() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "echo $$; sleep 30 & echo $!; sleep 30", "hard_timeout": 2}),
    );
    assert_eq!(r["status"], "timed_out", "{r}");
    assert_eq!(r["exit_code"], Value::Null, "ended by a signal: {r}");
    let sig = r["signal"]
        .as_str()
        .unwrap_or_else(|| panic!("signal named: {r}"));
    assert!(sig == "SIGTERM" || sig == "SIGKILL", "{r}");
    let pids: Vec<i32> = str_of(&r, "stdout")
        .lines()
        .map(|l| l.trim().parse().expect("a pid per line"))
        .collect();
    assert_eq!(pids.len(), 2, "shell pid and background pid: {r}");
    let (shell, background) = (pids[0], pids[1]);
    wait_until("the shell and its background sleep are gone", || {
        !pid_alive(shell) && !pid_alive(background)
    });
    wait_until("the process group is empty", || !group_alive(shell));
    // Later reads agree.
    let o = output(
        &mut c,
        json!({"session_id": r["session_id"], "command_id": r["command_id"]}),
    );
    assert_eq!(o["command"]["status"], "timed_out");
    assert_eq!(o["command"]["exit_code"], Value::Null);
}

#[test]
fn async_mode_answers_at_once_and_the_command_completes() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "sleep 0.3; echo fin; echo bye >&2", "async_mode": true}),
    );
    assert_eq!(r["status"], "running");
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(r["offset"], 0);
    assert_eq!(r["stderr_offset"], 0);
    let session = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let g = gather(&mut c, &session, &id, (0, 0));
    assert_eq!(g.stdout, "fin\n");
    assert_eq!(g.stderr, "bye\n");
    assert_eq!(g.command["status"], "completed");
    assert_eq!(g.command["exit_code"], 0);
}

#[test]
fn max_output_length_cuts_the_middle_in_characters() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let cmd = "for i in $(seq 100); do printf 'é'; printf 'ü' >&2; done";
    let r = exec(&mut c, json!({"command": cmd, "max_output_length": 10}));
    assert_eq!(r["status"], "completed");
    // Offsets count bytes of the whole output, not of the cut text.
    assert_eq!(r["offset"], 200);
    assert_eq!(r["stderr_offset"], 200);
    for (field, ch) in [("stdout", 'é'), ("stderr", 'ü')] {
        let text = str_of(&r, field);
        assert_eq!(
            text.chars().filter(|c| *c == ch).count(),
            10,
            "{field}: {text:?}"
        );
        assert!(
            text.starts_with(ch) && text.ends_with(ch),
            "head and tail kept: {text:?}"
        );
        let marker: String = text.chars().filter(|c| *c != ch).collect();
        assert!(marker.contains("omitted"), "marker: {text:?}");
        assert!(
            marker.contains("90"),
            "marker names the 90 left out: {text:?}"
        );
        assert!(
            !marker.contains("180"),
            "counted characters, not bytes: {text:?}"
        );
    }
    // 0 disables the cut; the default (50000) does not cut 100 characters.
    let whole = "é".repeat(100);
    let r = exec(&mut c, json!({"command": cmd, "max_output_length": 0}));
    assert_eq!(r["stdout"], whole.as_str());
    assert_eq!(r["stderr"], "ü".repeat(100).as_str());
    let r = exec(&mut c, json!({"command": cmd}));
    assert_eq!(r["stdout"], whole.as_str());
    // Exactly at the limit: no cut.
    let r = exec(&mut c, json!({"command": cmd, "max_output_length": 100}));
    assert_eq!(r["stdout"], whole.as_str());
}

#[test]
fn exec_dir_env_and_cd_follow_the_session_rules() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let a = TempDir::new();
    let b = TempDir::new();
    let (a_path, b_path) = (canonical(a.path()), canonical(b.path()));
    let r = exec(&mut c, json!({"command": "pwd", "exec_dir": a_path}));
    assert_eq!(r["stdout"], format!("{a_path}\n"));
    let session = str_of(&r, "session_id").to_string();
    // exec_dir became the session's default.
    let r = exec(&mut c, json!({"command": "pwd", "session_id": session}));
    assert_eq!(r["stdout"], format!("{a_path}\n"));
    assert_eq!(r["session_id"], session.as_str());
    let listed = sessions(&mut c);
    let s = find_session(&listed, &session).expect("session listed");
    assert_eq!(s["working_dir"], a_path.as_str());
    // `cd` inside a command does not carry over.
    let r = exec(
        &mut c,
        json!({"command": "cd / && pwd", "session_id": session}),
    );
    assert_eq!(r["stdout"], "/\n");
    let r = exec(&mut c, json!({"command": "pwd", "session_id": session}));
    assert_eq!(r["stdout"], format!("{a_path}\n"));
    // env applies to that command only; `export` does not carry over either.
    let r = exec(
        &mut c,
        json!({"command": "echo ${MY_VAR:-unset}; export OTHER=1", "session_id": session,
               "env": {"MY_VAR": "hello world"}}),
    );
    assert_eq!(r["stdout"], "hello world\n");
    let r = exec(
        &mut c,
        json!({"command": "echo ${MY_VAR:-unset} ${OTHER:-unset}", "session_id": session}),
    );
    assert_eq!(r["stdout"], "unset unset\n");
    // A later exec_dir updates the default.
    let r = exec(
        &mut c,
        json!({"command": "pwd", "session_id": session, "exec_dir": b_path}),
    );
    assert_eq!(r["stdout"], format!("{b_path}\n"));
    let r = exec(&mut c, json!({"command": "pwd", "session_id": session}));
    assert_eq!(r["stdout"], format!("{b_path}\n"));
    // A bad exec_dir is invalid params naming it.
    let (code, data) = rpc_err(
        &mut c,
        "bash/exec",
        json!({"command": "pwd", "exec_dir": "relative/dir"}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data["field"], "exec_dir");
}

#[test]
fn session_ids_absent_empty_and_unknown() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r1 = exec(&mut c, json!({"command": "true"}));
    let r2 = exec(&mut c, json!({"command": "true", "session_id": ""}));
    let r3 = exec(&mut c, json!({"command": "true", "session_id": null}));
    let ids = [
        str_of(&r1, "session_id"),
        str_of(&r2, "session_id"),
        str_of(&r3, "session_id"),
    ];
    for id in ids {
        assert!(!id.is_empty(), "a new session gets an id");
    }
    assert_ne!(ids[0], ids[1]);
    assert_ne!(ids[0], ids[2]);
    assert_ne!(ids[1], ids[2]);
    let r4 = exec(&mut c, json!({"command": "true", "session_id": "mine-42"}));
    assert_eq!(r4["session_id"], "mine-42");
    let r5 = exec(&mut c, json!({"command": "true", "session_id": "mine-42"}));
    assert_eq!(r5["session_id"], "mine-42");
    assert_ne!(r4["command_id"], r5["command_id"], "command ids are unique");
    let listed = sessions(&mut c);
    let mut got = session_ids(&listed);
    got.sort();
    let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    want.push("mine-42".into());
    want.sort();
    assert_eq!(got, want);
    let mine = find_session(&listed, "mine-42").unwrap();
    assert_eq!(mine["command_count"], 2);
    assert_eq!(mine["current_command"], Value::Null);
    assert_eq!(mine["status"], "ready");
}

// ---- output and offsets ----------------------------------------------------------

/// 125000 lines of 42 bytes (5.25 MB, just over 5 MiB) in 50 bursts, with multi-byte
/// characters that pipe writes may split.
const BIG_COMMAND: &str = "for i in $(seq 0 49); do \
     seq -f '%08.0f ü€ abcdefghijklmnopqrstuvwxyz' $((i*2500+1)) $((i*2500+2500)); \
     sleep 0.01; done";

#[test]
fn five_mib_read_by_offsets_reassembles_byte_for_byte() {
    let d = Daemon::start(&["--output-limit", "8M"]);
    let mut c = d.client();
    let expected = local_stdout(BIG_COMMAND);
    assert!(
        expected.len() >= 5 << 20,
        "the generator makes 5 MiB: {}",
        expected.len()
    );
    let expected = String::from_utf8(expected).expect("UTF-8");
    let r = exec(&mut c, json!({"command": BIG_COMMAND, "async_mode": true}));
    let session = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let g = gather(&mut c, &session, &id, (0, 0));
    assert_eq!(g.command["status"], "completed");
    assert_eq!(g.command["exit_code"], 0);
    assert_eq!(g.offset, expected.len() as u64);
    assert_eq!(g.stderr_offset, 0);
    assert_eq!(g.stderr, "");
    assert_eq!(g.stdout.len(), expected.len());
    assert!(
        g.stdout == expected,
        "reassembled stdout differs from the local run"
    );
    eprintln!("reassembled {} bytes in {} reads", g.stdout.len(), g.calls);

    // Without wait, from offsets on character boundaries: the exact rest.
    let total = expected.len() as u64;
    for at in [0u64, 42, 1 << 20, total - 42, total] {
        let r = output(
            &mut c,
            json!({"session_id": session, "command_id": id, "offset": at}),
        );
        assert_eq!(r["offset"], total);
        assert_eq!(r["stdout"], &expected[at as usize..], "from offset {at}");
        assert!(r.get("stdout_skipped").is_none());
    }
    // From inside 'ü' (the byte after its first): the window starts at the next character.
    let inside = 42 + 10;
    assert!(!expected.is_char_boundary(inside));
    let r = output(
        &mut c,
        json!({"session_id": session, "command_id": id, "offset": inside}),
    );
    assert_eq!(r["stdout"], &expected[inside + 1..]);
    assert_eq!(r["offset"], total);
}

#[test]
fn a_stale_offset_reports_what_was_skipped() {
    let d = Daemon::start(&["--output-limit", "64K"]);
    let mut c = d.client();
    // 65536 lines of 16 bytes: exactly 1 MiB.
    let cmd = "seq -f '%015.0f' 1 65536";
    let local = local_stdout(cmd);
    let total = local.len() as u64;
    assert_eq!(total, 1 << 20);
    let retained = String::from_utf8(local[local.len() - (64 << 10)..].to_vec()).unwrap();
    let r = exec(&mut c, json!({"command": cmd, "max_output_length": 0}));
    assert_eq!(r["status"], "completed");
    assert_eq!(r["offset"], total);
    assert_eq!(
        r["stdout"],
        retained.as_str(),
        "exec returns what is retained"
    );
    let session = str_of(&r, "session_id").to_string();

    let o = output(&mut c, json!({"session_id": session, "offset": 0}));
    assert_eq!(o["stdout_skipped"], total - (64 << 10));
    assert!(
        o.get("stderr_skipped").is_none(),
        "nothing skipped on stderr: {}",
        o["stderr"]
    );
    assert_eq!(o["stdout"], retained.as_str());
    assert_eq!(o["offset"], total);
    assert_eq!(o["stderr_offset"], 0);
    assert_eq!(o["command"]["status"], "completed");

    // Still retained: no skip.
    let o = output(&mut c, json!({"session_id": session, "offset": total - 16}));
    assert_eq!(o["stdout"], "000000000065536\n");
    assert!(o.get("stdout_skipped").is_none());
    // At and past the end: "" and the end offset.
    for past in [total, total + 1, 5 << 20] {
        let o = output(
            &mut c,
            json!({"session_id": session, "offset": past, "stderr_offset": 1000}),
        );
        assert_eq!(o["stdout"], "", "offset {past}");
        assert_eq!(o["offset"], total, "offset {past}");
        assert_eq!(o["stderr"], "");
        assert_eq!(o["stderr_offset"], 0);
        assert!(o.get("stdout_skipped").is_none());
    }
    // With wait, a past-the-end offset of an ended command answers at once too.
    let o = output(
        &mut c,
        json!({"session_id": session, "offset": 5 << 20, "wait": true, "wait_timeout": 10}),
    );
    assert_eq!(o["stdout"], "");
    assert_eq!(o["offset"], total);
}

#[test]
fn long_poll_answers_on_output_on_exit_and_on_timeout() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // New output.
    let r = exec(
        &mut c,
        json!({"command": "sleep 0.5; echo x; sleep 0.5", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    assert_eq!(o["stdout"], "x\n");
    assert_eq!(o["offset"], 2);
    // Exit without output.
    let r = exec(
        &mut c,
        json!({"command": "sleep 0.3; exit 7", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    assert_eq!(o["stdout"], "");
    assert_eq!(o["stderr"], "");
    assert_eq!(o["command"]["status"], "completed");
    assert_eq!(o["command"]["exit_code"], 7);
    // wait_timeout passes.
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 0.3}),
    );
    assert_eq!(o["stdout"], "");
    assert_eq!(o["stderr"], "");
    assert_eq!(o["offset"], 0);
    assert_eq!(o["command"]["status"], "running");
    assert_eq!(o["command"]["exit_code"], Value::Null);
    // A parked long-poll does not hold back later requests on the same connection.
    let parked = c
        .send(
            "bash/output",
            json!({"session_id": s, "wait": true, "wait_timeout": 15}),
        )
        .unwrap();
    let listed = sessions(&mut c);
    assert!(find_session(&listed, &s).is_some());
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGKILL"}));
    assert_eq!(k["status"], "killed");
    let o = c.wait_response(parked).expect("parked output answered");
    conform("BashOutputResult", &o);
    assert_eq!(o["command"]["status"], "killed");
}

#[test]
fn output_addresses_command_id_or_the_newest_command() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let first = exec(&mut c, json!({"command": "echo first", "session_id": "s1"}));
    let second = exec(
        &mut c,
        json!({"command": "echo second >&2", "session_id": "s1"}),
    );
    let o = output(
        &mut c,
        json!({"session_id": "s1", "command_id": first["command_id"]}),
    );
    assert_eq!(o["stdout"], "first\n");
    assert_eq!(o["stderr"], "");
    assert_eq!(o["command"]["command_id"], first["command_id"]);
    assert_eq!(o["command"]["command"], "echo first");
    let o = output(&mut c, json!({"session_id": "s1"}));
    assert_eq!(o["command"]["command_id"], second["command_id"]);
    assert_eq!(o["stdout"], "");
    assert_eq!(o["stderr"], "second\n");
    assert_eq!(
        (o["offset"].as_u64(), o["stderr_offset"].as_u64()),
        (Some(0), Some(7))
    );
    // A command of another session, or an unknown one, is not found.
    let other = exec(&mut c, json!({"command": "true", "session_id": "s2"}));
    let (code, _) = rpc_err(
        &mut c,
        "bash/output",
        json!({"session_id": "s1", "command_id": other["command_id"]}),
    );
    assert_eq!(code, -32002);
    let (code, _) = rpc_err(
        &mut c,
        "bash/output",
        json!({"session_id": "s1", "command_id": "cmd_999999"}),
    );
    assert_eq!(code, -32002);
    // A session with no command yet: invalid state.
    create_session(&mut c, json!({"session_id": "empty"}));
    let (code, _) = rpc_err(&mut c, "bash/output", json!({"session_id": "empty"}));
    assert_eq!(code, -32000);
}

#[test]
fn several_commands_of_one_session_run_at_once_with_their_own_buffers() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let reader = |name: &str| format!("read -r x; echo \"{name}:$x\"; echo \"{name}-err:$x\" >&2");
    let a = exec(
        &mut c,
        json!({"command": reader("A"), "session_id": "m", "async_mode": true}),
    );
    let b = exec(
        &mut c,
        json!({"command": reader("B"), "session_id": "m", "async_mode": true}),
    );
    // A third, synchronous command completes while both still wait for input.
    let s = exec(
        &mut c,
        json!({"command": "echo S; echo S-err >&2", "session_id": "m"}),
    );
    assert_eq!(s["status"], "completed");
    assert_eq!(s["stdout"], "S\n");
    assert_eq!(s["stderr"], "S-err\n");
    let listed = sessions(&mut c);
    let m = find_session(&listed, "m").unwrap();
    assert_eq!(m["command_count"], 3);
    assert!(
        m["current_command"] == reader("A").as_str()
            || m["current_command"] == reader("B").as_str(),
        "a running command is current: {m}"
    );
    // Both still run, with nothing in their buffers.
    for cmd in [&a, &b] {
        let o = output(
            &mut c,
            json!({"session_id": "m", "command_id": cmd["command_id"]}),
        );
        assert_eq!(o["command"]["status"], "running");
        assert_eq!(
            (o["stdout"].as_str(), o["stderr"].as_str()),
            (Some(""), Some(""))
        );
    }
    // Input by command_id reaches the right one.
    assert_eq!(
        write(
            &mut c,
            json!({"session_id": "m", "command_id": b["command_id"], "input": "one\n"})
        ),
        4
    );
    assert_eq!(
        write(
            &mut c,
            json!({"session_id": "m", "command_id": a["command_id"], "input": "two\n"})
        ),
        4
    );
    let ga = gather(&mut c, "m", str_of(&a, "command_id"), (0, 0));
    let gb = gather(&mut c, "m", str_of(&b, "command_id"), (0, 0));
    assert_eq!(
        (ga.stdout.as_str(), ga.stderr.as_str()),
        ("A:two\n", "A-err:two\n")
    );
    assert_eq!(
        (gb.stdout.as_str(), gb.stderr.as_str()),
        ("B:one\n", "B-err:one\n")
    );
    assert_eq!(ga.command["status"], "completed");
    assert_eq!(gb.command["status"], "completed");
    // The synchronous one's buffers are untouched.
    let o = output(
        &mut c,
        json!({"session_id": "m", "command_id": s["command_id"]}),
    );
    assert_eq!(
        (o["stdout"].as_str(), o["stderr"].as_str()),
        (Some("S\n"), Some("S-err\n"))
    );
}

// ---- stdin -----------------------------------------------------------------------

#[test]
fn stdin_reaches_cat_and_eof_ends_it() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "cat", "async_mode": true, "hard_timeout": 60}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    assert_eq!(
        write(
            &mut c,
            json!({"session_id": s, "input": "hello from stdin\n"})
        ),
        17
    );
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    assert_eq!(o["stdout"], "hello from stdin\n");
    assert_eq!(o["command"]["status"], "running");
    // Multi-byte input: `written` counts bytes.
    let n = write(
        &mut c,
        json!({"session_id": s, "command_id": id, "input": "é€\n", "eof": true}),
    );
    assert_eq!(n, 6);
    let g = gather(&mut c, &s, &id, (17, 0));
    assert_eq!(g.stdout, "é€\n");
    assert_eq!(g.command["status"], "completed");
    assert_eq!(g.command["exit_code"], 0);
    // Exited: writing is invalid state, by command_id or not.
    let (code, _) = rpc_err(
        &mut c,
        "bash/write",
        json!({"session_id": s, "command_id": id, "input": "x"}),
    );
    assert_eq!(code, -32000);
    let (code, _) = rpc_err(&mut c, "bash/write", json!({"session_id": s, "input": "x"}));
    assert_eq!(code, -32000);
}

#[test]
fn stdin_eof_before_the_command_reads() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "sleep 0.3; wc -c", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    assert_eq!(
        write(
            &mut c,
            json!({"session_id": s, "input": "abc", "eof": true})
        ),
        3
    );
    // After eof was asked for, further input is refused.
    let (code, _) = rpc_err(
        &mut c,
        "bash/write",
        json!({"session_id": s, "command_id": id, "input": "more"}),
    );
    assert_eq!(code, -32000);
    let g = gather(&mut c, &s, &id, (0, 0));
    assert_eq!(g.stdout.trim(), "3");
    assert_eq!(g.command["status"], "completed");
}

#[test]
fn stdin_overflow_is_refused_and_the_daemon_keeps_serving() {
    // A 1 MiB write needs a message larger than the default 1 MiB --max-message.
    let d = Daemon::start(&["--max-message", "4M"]);
    let mut c = d.client();
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    let big = "a".repeat(1 << 20);
    let (code, data) = rpc_err(&mut c, "bash/write", json!({"session_id": s, "input": big}));
    assert_eq!(code, -32003);
    assert_eq!(data["limit"], "stdin-buffer");
    assert_eq!(data["value"], 64 << 10);
    // Another connection is served at once; so is this one.
    let mut other = d.client();
    let r2 = exec(&mut other, json!({"command": "echo alive"}));
    assert_eq!(r2["stdout"], "alive\n");
    let o = output(&mut c, json!({"session_id": s}));
    assert_eq!(o["command"]["status"], "running");
    // What fits is accepted (into the pipe and the buffer), what then overflows is refused.
    let chunk = "b".repeat(60 << 10);
    let mut accepted = 0;
    let refused = loop {
        assert!(accepted < 10, "a command that never reads cannot take 600K");
        match c.call("bash/write", json!({"session_id": s, "input": chunk})) {
            Ok(v) => {
                assert_eq!(v, json!({"written": 60 << 10}));
                accepted += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(accepted >= 1, "60K fits an empty buffer");
    assert_eq!(refused.code(), Some(-32003), "{refused}");
    let r3 = exec(&mut other, json!({"command": "echo still"}));
    assert_eq!(r3["stdout"], "still\n");
    assert!(pid_alive(d.pid()));
}

#[test]
fn a_command_closing_its_stdin_does_not_hurt_the_daemon() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // Closes stdin at once, says so, then lingers.
    let r = exec(
        &mut c,
        json!({"command": "exec 0<&-; echo closed; sleep 5", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    assert_eq!(o["stdout"], "closed\n");
    let chunk = "z".repeat(60 << 10);
    let first = c.call(
        "bash/write",
        json!({"session_id": s, "command_id": id, "input": chunk}),
    );
    if let Err(e) = &first {
        assert_eq!(e.code(), Some(-32000), "{e}");
    }
    assert_closed_with_undelivered_input(&mut c, &s, &id);
    // The daemon lives and serves; the command runs on.
    assert!(pid_alive(d.pid()));
    let o = output(&mut c, json!({"session_id": s, "command_id": id}));
    assert_eq!(o["command"]["status"], "running");
    let r = exec(&mut d.client(), json!({"command": "echo ok"}));
    assert_eq!(r["stdout"], "ok\n");
}

#[test]
fn a_command_closing_its_stdin_while_input_waits() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let dir = TempDir::new();
    let go = dir.path().join("go");
    // Does not read; closes stdin once told to.
    let cmd = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; exec 0<&-; echo closed; sleep 5",
        go.display()
    );
    let r = exec(
        &mut c,
        json!({"command": cmd, "async_mode": true, "hard_timeout": 60}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    // Fill the pipe and leave input waiting in the daemon's buffer.
    let chunk = "y".repeat(60 << 10);
    assert_eq!(
        write(&mut c, json!({"session_id": s, "input": chunk})),
        60 << 10
    );
    assert_eq!(
        write(&mut c, json!({"session_id": s, "input": chunk})),
        60 << 10
    );
    std::fs::write(&go, b"").unwrap();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    assert_eq!(o["stdout"], "closed\n");
    assert_closed_with_undelivered_input(&mut c, &s, &id);
    assert!(pid_alive(d.pid()));
    let o = output(&mut c, json!({"session_id": s, "command_id": id}));
    assert_eq!(o["command"]["status"], "running");
    let r = exec(&mut d.client(), json!({"command": "echo ok"}));
    assert_eq!(r["stdout"], "ok\n");
}

/// A write to a command whose stdin broke: `-32000`, reporting input as not delivered
/// (in `data.undelivered` or in the message).
#[track_caller]
fn assert_closed_with_undelivered_input(c: &mut Client, session: &str, id: &str) {
    let (code, message, data) = err(
        c,
        "bash/write",
        json!({"session_id": session, "command_id": id, "input": "x"}),
    );
    assert_eq!(code, -32000, "{message}");
    let data = data.unwrap_or(Value::Null);
    assert!(
        data["undelivered"].as_u64().is_some_and(|n| n > 0) || message.contains("not delivered"),
        "the input is reported as not delivered: {message} {data}"
    );
}

// ---- signals -----------------------------------------------------------------------

#[test]
fn kill_sends_signals_by_name() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // SIGINT.
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGINT"}));
    assert_eq!(k["command_id"], r["command_id"]);
    assert_eq!(k["command"], "sleep 30");
    assert_eq!(k["status"], "killed");
    assert_eq!(k["exit_code"], Value::Null);
    assert_eq!(k["signal"], "SIGINT");
    let o = output(&mut c, json!({"session_id": s}));
    assert_eq!(o["command"]["status"], "killed");
    assert_eq!(o["command"]["signal"], "SIGINT");

    // "TERM" without the prefix.
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    let k = kill(&mut c, json!({"session_id": s, "signal": "TERM"}));
    assert_eq!(k["status"], "killed");
    assert_eq!(k["exit_code"], Value::Null);
    assert_eq!(k["signal"], "SIGTERM");

    // The default is SIGTERM.
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    let k = kill(&mut c, json!({"session_id": s}));
    assert_eq!(k["status"], "killed");
    assert_eq!(k["signal"], "SIGTERM");

    // A shell that ignores TERM survives it and dies of SIGKILL.
    let r = exec(
        &mut c,
        json!({"command": "trap '' TERM; echo $$; sleep 30", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    let pid: i32 = str_of(&o, "stdout")
        .trim()
        .parse()
        .expect("the shell's pid");
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGTERM"}));
    assert_eq!(k["status"], "running", "TERM is ignored: {k}");
    assert!(pid_alive(pid));
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGKILL"}));
    assert_eq!(k["status"], "killed");
    assert_eq!(k["exit_code"], Value::Null);
    assert_eq!(k["signal"], "SIGKILL");
    wait_until("the group is gone after SIGKILL", || !group_alive(pid));

    // Unknown names are invalid params naming the field.
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let s = str_of(&r, "session_id").to_string();
    for bad in ["SIGBOGUS", "SIGSEGV", "9", ""] {
        let (code, data) = rpc_err(&mut c, "bash/kill", json!({"session_id": s, "signal": bad}));
        assert_eq!(code, -32602, "signal {bad:?}");
        assert_eq!(data["field"], "signal", "signal {bad:?}");
    }
    let o = output(&mut c, json!({"session_id": s}));
    assert_eq!(
        o["command"]["status"], "running",
        "a refused kill sends nothing"
    );
}

#[test]
fn kill_with_nothing_running_answers_the_newest_state_and_sends_nothing() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    exec(&mut c, json!({"command": "exit 1", "session_id": "done"}));
    let last = exec(
        &mut c,
        json!({"command": "echo hi; exit 3", "session_id": "done"}),
    );
    assert_eq!(last["status"], "completed");
    let k = kill(&mut c, json!({"session_id": "done", "signal": "SIGKILL"}));
    assert_eq!(
        k,
        json!({"command_id": last["command_id"], "command": "echo hi; exit 3",
               "status": "completed", "exit_code": 3})
    );
    let o = output(&mut c, json!({"session_id": "done"}));
    assert_eq!(o["command"]["status"], "completed");
    assert_eq!(o["command"]["exit_code"], 3);
    assert_eq!(o["stdout"], "hi\n");
}

#[test]
fn kill_by_command_id_leaves_the_others_running() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let a = exec(
        &mut c,
        json!({"command": "sleep 30", "session_id": "k", "async_mode": true}),
    );
    let b = exec(
        &mut c,
        json!({"command": "sleep 31", "session_id": "k", "async_mode": true}),
    );
    let k = kill(
        &mut c,
        json!({"session_id": "k", "command_id": a["command_id"], "signal": "SIGKILL"}),
    );
    assert_eq!(k["command_id"], a["command_id"]);
    assert_eq!(k["status"], "killed");
    let o = output(
        &mut c,
        json!({"session_id": "k", "command_id": b["command_id"]}),
    );
    assert_eq!(o["command"]["status"], "running");
    // Without command_id: the newest running command.
    let k = kill(&mut c, json!({"session_id": "k", "signal": "SIGKILL"}));
    assert_eq!(k["command_id"], b["command_id"]);
    assert_eq!(k["status"], "killed");
}

// ---- sessions ----------------------------------------------------------------------

#[test]
fn sessions_create_list_and_close() {
    let work = TempDir::new();
    let work_path = canonical(work.path());
    let d = Daemon::start(&["--workdir", &work_path]);
    let mut c = d.client();
    let other = TempDir::new();
    let other_path = canonical(other.path());

    let fresh = create_session(&mut c, json!({}));
    let fresh_id = str_of(&fresh, "session_id").to_string();
    assert!(!fresh_id.is_empty());
    assert_eq!(fresh["status"], "ready");
    assert_eq!(fresh["working_dir"], work_path.as_str());
    assert_eq!(fresh["command_count"], 0);
    assert_eq!(fresh["current_command"], Value::Null);

    let alpha = create_session(
        &mut c,
        json!({"session_id": "alpha", "exec_dir": other_path}),
    );
    assert_eq!(alpha["session_id"], "alpha");
    assert_eq!(alpha["working_dir"], other_path.as_str());
    // An existing id comes back unchanged (exec_dir does not apply to it).
    let again = create_session(
        &mut c,
        json!({"session_id": "alpha", "exec_dir": work_path}),
    );
    for field in [
        "session_id",
        "working_dir",
        "created_at",
        "command_count",
        "status",
    ] {
        assert_eq!(again[field], alpha[field], "{field}");
    }
    let r = exec(&mut c, json!({"command": "pwd", "session_id": "alpha"}));
    assert_eq!(r["stdout"], format!("{other_path}\n"));

    // A running command shows as current.
    let r = exec(
        &mut c,
        json!({"command": "echo $$; sleep 30", "session_id": "alpha", "async_mode": true}),
    );
    let o = output(
        &mut c,
        json!({"session_id": "alpha", "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    let pid: i32 = str_of(&o, "stdout").trim().parse().expect("pid");
    let listed = sessions(&mut c);
    let mut ids = session_ids(&listed);
    ids.sort();
    let mut want = vec![fresh_id.clone(), "alpha".to_string()];
    want.sort();
    assert_eq!(ids, want);
    let a = find_session(&listed, "alpha").unwrap();
    assert_eq!(a["current_command"], "echo $$; sleep 30");
    assert_eq!(a["command_count"], 2);
    assert!(str_of(a, "created_at") <= str_of(a, "last_used_at"), "{a}");

    // Close kills what runs and frees the session.
    close_session(&mut c, "alpha");
    wait_until("the closed session's command is gone", || {
        !pid_alive(pid) && !group_alive(pid)
    });
    let listed = sessions(&mut c);
    assert_eq!(session_ids(&listed), vec![fresh_id.clone()]);
    for (method, params) in [
        ("bash/output", json!({"session_id": "alpha"})),
        (
            "bash/output",
            json!({"session_id": "alpha", "command_id": r["command_id"]}),
        ),
        ("bash/write", json!({"session_id": "alpha", "input": "x"})),
        ("bash/kill", json!({"session_id": "alpha"})),
        ("bash/sessions/close", json!({"session_id": "alpha"})),
        ("bash/output", json!({"session_id": "never"})),
        ("bash/write", json!({"session_id": "never", "input": "x"})),
        ("bash/kill", json!({"session_id": "never"})),
        ("bash/sessions/close", json!({"session_id": "never"})),
    ] {
        let (code, _) = rpc_err(&mut c, method, params.clone());
        assert_eq!(code, -32002, "{method} {params}");
    }
    // Unknown ids are not created by output, write, kill or close.
    assert_eq!(session_ids(&sessions(&mut c)), vec![fresh_id.clone()]);
    // The id can be used again: a new session.
    let alpha2 = create_session(&mut c, json!({"session_id": "alpha"}));
    assert_eq!(alpha2["command_count"], 0);
    assert_eq!(alpha2["working_dir"], work_path.as_str());
    close_session(&mut c, "alpha");
    close_session(&mut c, &fresh_id);
    assert!(sessions(&mut c).is_empty());
}

/// At `--max-sessions` every session is busy: a new one is refused with `-32003`.
#[test]
fn the_session_cap_is_a_limit_error_when_every_session_is_busy() {
    let d = Daemon::start(&["--max-sessions", "2"]);
    let mut c = d.client();
    create_session(&mut c, json!({"session_id": "one"}));
    exec(
        &mut c,
        json!({"command": "sleep 30", "session_id": "one", "async_mode": true}),
    );
    let r = exec(&mut c, json!({"command": "sleep 30", "async_mode": true}));
    let two = str_of(&r, "session_id").to_string();
    for (method, params) in [
        ("bash/sessions/create", json!({"session_id": "three"})),
        ("bash/sessions/create", json!({})),
        ("bash/exec", json!({"command": "true"})),
        (
            "bash/exec",
            json!({"command": "true", "session_id": "three"}),
        ),
    ] {
        let (code, data) = rpc_err(&mut c, method, params.clone());
        assert_eq!(code, -32003, "{method} {params}");
        assert_eq!(data["limit"], "max-sessions", "{method} {params}");
        assert_eq!(data["value"], 2, "{method} {params}");
    }
    // Existing sessions still work.
    create_session(&mut c, json!({"session_id": "one"}));
    let r = exec(&mut c, json!({"command": "echo ok", "session_id": two}));
    assert_eq!(r["stdout"], "ok\n");
    assert_eq!(sessions(&mut c).len(), 2);
    // Freeing one makes room.
    close_session(&mut c, "one");
    let three = create_session(&mut c, json!({"session_id": "three"}));
    assert_eq!(three["session_id"], "three");
}

/// At `--max-sessions` with sessions that run nothing, the least recently used of those
/// is closed to make room: a loop of one-off sessions never exhausts the daemon.
#[test]
fn the_session_cap_evicts_the_least_recently_used_idle_session() {
    let d = Daemon::start(&["--max-sessions", "3"]);
    let mut c = d.client();
    exec(
        &mut c,
        json!({"command": "sleep 30", "session_id": "busy", "async_mode": true}),
    );
    exec(&mut c, json!({"command": "true", "session_id": "old"}));
    exec(&mut c, json!({"command": "true", "session_id": "newer"}));
    // "busy" is the least recently used, but runs a command: "old" goes instead.
    let r = exec(&mut c, json!({"command": "echo hi", "session_id": "fresh"}));
    assert_eq!(r["stdout"], "hi\n");
    let mut names: Vec<String> = sessions(&mut c)
        .iter()
        .map(|s| s["session_id"].as_str().unwrap_or_default().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["busy", "fresh", "newer"]);
    // Sessions made without a name, in a loop, keep working past the cap.
    for i in 0..10 {
        let r = exec(&mut c, json!({"command": format!("echo {i}")}));
        assert_eq!(r["stdout"], format!("{i}\n"));
    }
    assert_eq!(sessions(&mut c).len(), 3);
    assert!(
        d.log().contains("closed to make room"),
        "the eviction is logged: {}",
        d.log()
    );
}

#[test]
fn idle_sessions_are_reaped_but_not_while_a_command_runs() {
    let d = Daemon::start(&["--session-idle", "3s"]);
    let mut c = d.client();
    let dir = TempDir::new();
    let go = dir.path().join("go");
    // "busy" is used first, so it has been idle at least as long as "idle".
    let cmd = format!("while [ ! -e '{}' ]; do sleep 0.02; done", go.display());
    exec(
        &mut c,
        json!({"command": cmd, "session_id": "busy", "async_mode": true, "hard_timeout": 60}),
    );
    create_session(&mut c, json!({"session_id": "idle"}));
    let listed = sessions(&mut c);
    assert!(find_session(&listed, "idle").is_some());
    wait_until("the idle session is reaped", || {
        find_session(&sessions(&mut c), "idle").is_none()
    });
    let listed = sessions(&mut c);
    let busy = find_session(&listed, "busy").expect("a running command keeps its session");
    assert_eq!(busy["current_command"], cmd.as_str());
    // Longer than the idle period (3 s) again, so the busy session is looked at once
    // more while it runs: still kept.
    std::thread::sleep(Duration::from_millis(4500));
    let listed = sessions(&mut c);
    let busy = find_session(&listed, "busy").expect("still kept while it runs");
    assert_eq!(busy["current_command"], cmd.as_str());
    // Once it ends, the session goes idle and is reaped.
    std::fs::write(&go, b"").unwrap();
    wait_until("the busy session is reaped after its command ends", || {
        find_session(&sessions(&mut c), "busy").is_none()
    });
    let (code, _) = rpc_err(&mut c, "bash/output", json!({"session_id": "busy"}));
    assert_eq!(code, -32002);
}

#[test]
fn fifty_clients_at_once() {
    let d = Daemon::start(&[]);
    let handles: Vec<_> = (0..50)
        .map(|n| {
            let mut c = d.client();
            std::thread::spawn(move || {
                let session = format!("conc-{n}");
                for round in 0..3 {
                    let r = exec(
                        &mut c,
                        json!({"command": format!("echo {n}-{round}; echo {n}-{round} >&2"),
                               "session_id": session}),
                    );
                    assert_eq!(r["session_id"], session.as_str());
                    assert_eq!(r["status"], "completed");
                    assert_eq!(r["exit_code"], 0);
                    assert_eq!(r["stdout"], format!("{n}-{round}\n"));
                    assert_eq!(r["stderr"], format!("{n}-{round}\n"));
                }
                let o = output(&mut c, json!({"session_id": session}));
                assert_eq!(o["stdout"], format!("{n}-2\n"));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a client thread failed");
    }
    let mut c = d.client();
    let listed = sessions(&mut c);
    assert_eq!(listed.len(), 50);
    assert!(listed.iter().all(|s| s["command_count"] == 3));
}

#[test]
fn finished_commands_beyond_the_newest_hundred_are_dropped() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let ids: Vec<String> = (0..102)
        .map(|i| {
            let r = exec(
                &mut c,
                json!({"command": format!("echo {i}"), "session_id": "h"}),
            );
            assert_eq!(r["stdout"], format!("{i}\n"));
            str_of(&r, "command_id").to_string()
        })
        .collect();
    for old in &ids[..2] {
        let (code, _) = rpc_err(
            &mut c,
            "bash/output",
            json!({"session_id": "h", "command_id": old}),
        );
        assert_eq!(code, -32002, "{old} was dropped");
    }
    let o = output(&mut c, json!({"session_id": "h", "command_id": ids[2]}));
    assert_eq!(o["stdout"], "2\n");
    let o = output(&mut c, json!({"session_id": "h", "command_id": ids[101]}));
    assert_eq!(o["stdout"], "101\n");
    let o = output(&mut c, json!({"session_id": "h"}));
    assert_eq!(o["command"]["command_id"], ids[101].as_str());
    let listed = sessions(&mut c);
    assert_eq!(find_session(&listed, "h").unwrap()["command_count"], 102);
}

#[test]
fn params_are_checked() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for (params, field) in [
        (json!({}), "command"),
        (json!({"command": 5}), "command"),
        (json!({"command": "true", "timeout": -1}), "timeout"),
        (
            json!({"command": "true", "async_mode": "yes"}),
            "async_mode",
        ),
        (json!({"command": "true", "env": {"A": 1}}), "env"),
        (json!({"command": "true", "env": {"A=B": "x"}}), "env"),
    ] {
        let (code, data) = rpc_err(&mut c, "bash/exec", params.clone());
        assert_eq!(code, -32602, "{params}");
        assert_eq!(data["field"], field, "{params}");
    }
    let (code, data) = rpc_err(&mut c, "bash/output", json!({}));
    assert_eq!(code, -32602);
    assert_eq!(data["field"], "session_id");
    // null means absent.
    let r = exec(
        &mut c,
        json!({"command": "echo n", "timeout": null, "hard_timeout": null, "env": null,
               "exec_dir": null, "max_output_length": null, "async_mode": null}),
    );
    assert_eq!(r["stdout"], "n\n");
}

#[test]
fn the_schema_check_itself_rejects_bad_objects() {
    let good = json!({"session_id": "s", "command_id": "c", "command": "true",
                      "status": "completed", "stdout": "", "stderr": "", "exit_code": 0,
                      "offset": 0, "stderr_offset": 0});
    conform("BashExecResult", &good);
    let mut bad_status = good.clone();
    bad_status["status"] = json!("finished");
    let mut extra = good.clone();
    extra["pid"] = json!(1);
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("command_id");
    let mut wrong_type = good.clone();
    wrong_type["offset"] = json!("4");
    for bad in [bad_status, extra, missing, wrong_type] {
        let caught = std::panic::catch_unwind(|| conform("BashExecResult", &bad));
        assert!(caught.is_err(), "accepted {bad}");
    }
    let bad_time = json!({"session_id": "s", "status": "ready", "working_dir": "/",
                          "created_at": "2026-01-01T00:00:00+01:00",
                          "last_used_at": "2026-01-01T00:00:00Z"});
    assert!(std::panic::catch_unwind(|| conform("BashSessionInfo", &bad_time)).is_err());
    let bad_nested = json!({"session_id": "s", "stdout": "", "stderr": "", "offset": 0,
                            "stderr_offset": 0,
                            "command": {"command_id": "c", "command": "x", "status": "done"}});
    assert!(std::panic::catch_unwind(|| conform("BashOutputResult", &bad_nested)).is_err());
}

#[test]
fn split_characters_are_held_back_until_complete() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // 'é' written one byte at a time with a pause between.
    let r = exec(
        &mut c,
        json!({"command": "printf 'a\\303'; sleep 0.5; printf '\\251b'", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    // Either "a" alone (the lead byte held back) or everything once complete.
    let first = str_of(&o, "stdout").to_string();
    assert!(first == "a" || first == "aéb", "{o}");
    let at = o["offset"].as_u64().unwrap();
    assert_eq!(
        at as usize,
        first.len(),
        "the offset stops before a held-back byte"
    );
    let g = gather(&mut c, &s, &id, (at, 0));
    assert_eq!(format!("{first}{}", g.stdout), "aéb");
    assert_eq!(g.offset, 4);
    // A stream that ends inside a character: the stray byte becomes U+FFFD.
    let r = exec(&mut c, json!({"command": "printf 'a\\303'"}));
    assert_eq!(r["stdout"], "a\u{fffd}");
    assert_eq!(r["offset"], 2);
}

#[test]
fn closing_a_session_or_stopping_the_daemon_answers_parked_requests_as_killed() {
    let mut d = Daemon::start(&[]);
    let mut a = d.client();
    let mut b = d.client();
    let mut watcher = d.client();
    let sync = a
        .send(
            "bash/exec",
            json!({"command": "echo started; sleep 30", "session_id": "z"}),
        )
        .unwrap();
    // Wait until it runs, then park a long-poll on it from another connection.
    wait_until("the command started", || {
        b.call("bash/output", json!({"session_id": "z"}))
            .is_ok_and(|o| o["stdout"] == "started\n")
    });
    let poll = watcher
        .send(
            "bash/output",
            json!({"session_id": "z", "offset": 8, "wait": true, "wait_timeout": 15}),
        )
        .unwrap();
    close_session(&mut b, "z");
    let r = a.wait_response(sync).expect("sync exec answered");
    conform("BashExecResult", &r);
    assert_eq!(r["status"], "killed", "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(r["stdout"], "started\n");
    assert!(r["signal"].is_string(), "{r}");
    let o = watcher.wait_response(poll).expect("long-poll answered");
    conform("BashOutputResult", &o);
    assert_eq!(o["command"]["status"], "killed");

    // Shutdown: a parked synchronous exec gets its (killed) result or -32007.
    let sync = a
        .send(
            "bash/exec",
            json!({"command": "echo up; sleep 30", "session_id": "y"}),
        )
        .unwrap();
    wait_until("the second command started", || {
        b.call("bash/output", json!({"session_id": "y"}))
            .is_ok_and(|o| o["stdout"] == "up\n")
    });
    assert_eq!(d.terminate(), Some(0));
    match a.wait_response(sync) {
        Ok(r) => {
            conform("BashExecResult", &r);
            assert_eq!(r["status"], "killed", "{r}");
            assert_eq!(r["stdout"], "up\n");
        }
        Err(e) => assert_eq!(e.code(), Some(-32007), "{e}"),
    }
}

#[test]
fn a_megabyte_of_stdin_flows_through_the_buffer() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // ~1 MB of numbered lines (under the 1 MiB output ring, so all of it is retained).
    let data: String = (0..110_000).map(|i| format!("{i:08}\n")).collect();
    assert!(data.len() < 1 << 20);
    let r = exec(
        &mut c,
        json!({"command": "cat", "async_mode": true, "hard_timeout": 60}),
    );
    let s = str_of(&r, "session_id").to_string();
    let id = str_of(&r, "command_id").to_string();
    let deadline = Instant::now() + WAIT;
    let mut sent = 0;
    while sent < data.len() {
        assert!(
            Instant::now() < deadline,
            "stdin did not drain within {WAIT:?}"
        );
        let end = (sent + 50_000).min(data.len());
        match c.call(
            "bash/write",
            json!({"session_id": s, "command_id": id, "input": &data[sent..end]}),
        ) {
            Ok(v) => {
                assert_eq!(v, json!({"written": end - sent}));
                sent = end;
            }
            Err(e) => {
                // Full for now: the buffer drains as cat reads.
                assert_eq!(e.code(), Some(-32003), "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    assert_eq!(
        write(&mut c, json!({"session_id": s, "input": "", "eof": true})),
        0
    );
    let g = gather(&mut c, &s, &id, (0, 0));
    assert_eq!(g.command["status"], "completed");
    assert_eq!(g.command["exit_code"], 0);
    assert_eq!(g.stdout.len(), data.len());
    assert!(g.stdout == data, "cat echoed the input byte for byte");
}

#[test]
fn a_lingering_background_child_neither_delays_the_exit_nor_gets_a_kill() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // The background sleep keeps stdout open and outlives the shell.
    let r = exec(
        &mut c,
        json!({"command": "sleep 30 & echo $!", "session_id": "bg"}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["exit_code"], 0);
    let orphan: i32 = str_of(&r, "stdout").trim().parse().expect("background pid");
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            unsafe_kill(self.0, libc::SIGKILL);
        }
    }
    let _reap = Reap(orphan);
    assert!(pid_alive(orphan));
    // Nothing runs: kill answers the newest command's state and signals nobody...
    let k = kill(&mut c, json!({"session_id": "bg", "signal": "SIGTERM"}));
    assert_eq!(
        k,
        json!({"command_id": r["command_id"], "command": "sleep 30 & echo $!",
               "status": "completed", "exit_code": 0})
    );
    let probe = exec(&mut c, json!({"command": "true", "session_id": "probe"}));
    assert_eq!(probe["status"], "completed");
    assert!(
        pid_alive(orphan),
        "bash/kill with nothing running sent a signal"
    );
    // ...but SIGKILL kills what the ended command left (PROTOCOL 5, 14), and its state
    // stays as it was.
    let k = kill(&mut c, json!({"session_id": "bg", "signal": "SIGKILL"}));
    assert_eq!(k["status"], "completed", "{k}");
    wait_until("what it left is killed", || !pid_alive(orphan));
}

/// The scheduler state letter of a process (`R`, `S`, `T`, ...), if it exists.
fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .next()
        .map(str::to_string)
}

#[test]
fn hard_timeout_escalates_to_sigkill_when_term_is_ignored() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "trap '' TERM; echo $$; sleep 30", "hard_timeout": 2}),
    );
    assert_eq!(r["status"], "timed_out", "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(
        r["signal"], "SIGKILL",
        "TERM was ignored, so the grace ran out: {r}"
    );
    let pid: i32 = str_of(&r, "stdout").trim().parse().expect("pid");
    wait_until("the group is gone", || !group_alive(pid));
}

#[test]
fn sigstop_and_sigcont_answer_at_once() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = exec(
        &mut c,
        json!({"command": "echo $$; exec sleep 30", "async_mode": true}),
    );
    let s = str_of(&r, "session_id").to_string();
    let o = output(
        &mut c,
        json!({"session_id": s, "offset": 0, "wait": true, "wait_timeout": 15}),
    );
    let pid: i32 = str_of(&o, "stdout").trim().parse().expect("pid");
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGSTOP"}));
    assert_eq!(k["status"], "running");
    wait_until("stopped", || proc_state(pid).as_deref() == Some("T"));
    let k = kill(&mut c, json!({"session_id": s, "signal": "cont"}));
    assert_eq!(k["status"], "running");
    wait_until("continued", || proc_state(pid).is_some_and(|st| st != "T"));
    let k = kill(&mut c, json!({"session_id": s, "signal": "SIGKILL"}));
    assert_eq!(k["status"], "killed");
    assert_eq!(k["signal"], "SIGKILL");
}
