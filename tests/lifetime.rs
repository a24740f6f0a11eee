//! How long sessions live (PROTOCOL.md section 8): sessions a request made without naming
//! one are the first to go at `--max-sessions` and go idle sooner; a shell session someone
//! named is never closed to make room; a session the daemon closed says so when it is
//! named again.

use crate::shell::http;
use crate::util::*;

/// The text of `shell/exec`'s output for `command` in session `id`.
#[track_caller]
fn shell_line(c: &mut Client, id: &str, command: &str) -> String {
    let r = ok(c, "shell/exec", json!({"id": id, "command": command}));
    assert_eq!(r["status"], "completed", "{r}");
    r["output"].as_str().expect("output").trim().to_string()
}

/// The ids of the caller's bash sessions.
fn bash_sessions(c: &mut Client) -> Vec<String> {
    let l = ok(c, "bash/sessions", json!({}));
    let mut ids: Vec<String> = l
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["session_id"].as_str().unwrap_or_default().to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn three_hundred_one_shot_execs_close_none_of_the_named_sessions() {
    let d = Daemon::start(&["--max-sessions", "8"]);
    let mut c = d.client();
    let home = TempDir::new();
    let dir = home.path().display().to_string();
    ok(
        &mut c,
        "bash/exec",
        json!({"session_id": "work", "command": "true"}),
    );
    ok(&mut c, "shell/sessions/create", json!({"id": "sh"}));
    shell_line(&mut c, "sh", &format!("cd '{dir}' && export KEPT=yes"));
    // The README's first example, 300 times: no session named.
    for i in 0..300 {
        let params = json!({"command": format!("echo {i}")});
        let r = if i % 3 == 0 {
            let (status, body) = http(&d.socket, "POST", "/v1/bash/exec", &params);
            assert_eq!(status, 200, "{body}");
            body["data"].clone()
        } else {
            ok(&mut c, "bash/exec", params)
        };
        assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
        assert!(r.get("notice").is_none(), "{r}");
    }
    // A few one-shot shell sessions too.
    for i in 0..5 {
        let r = ok(
            &mut c,
            "shell/exec",
            json!({"command": format!("echo s{i}")}),
        );
        assert_eq!(r["status"], "completed", "{r}");
    }
    assert_eq!(
        shell_line(&mut c, "sh", "echo \"$PWD $KEPT\""),
        format!("{dir} yes"),
        "the named shell kept its directory and variables"
    );
    let ids = bash_sessions(&mut c);
    assert!(ids.contains(&"work".to_string()), "{ids:?}");
    let shells = ok(&mut c, "shell/sessions", json!({}));
    assert!(shells["sessions"]["sh"].is_object(), "{shells}");
    assert!(
        d.log().contains("closed to make room"),
        "one-shot sessions made the room"
    );
    assert_no_panic(&d);
}

#[test]
fn a_session_closed_for_idleness_says_so_when_named_again() {
    // One-shot sessions are idle after a sixth of this: 0.5 s.
    let d = Daemon::start(&["--session-idle", "3s"]);
    let mut c = d.client();
    for named in ["named", "cli"] {
        ok(
            &mut c,
            "bash/exec",
            json!({"session_id": named, "command": "true"}),
        );
    }
    ok(&mut c, "shell/sessions/create", json!({"id": "sh"}));
    let r = ok(&mut c, "bash/exec", json!({"command": "true"}));
    let oneshot = r["session_id"].as_str().expect("session_id").to_string();
    wait_until("the one-shot session is closed", || {
        !bash_sessions(&mut c).contains(&oneshot)
    });
    assert!(
        bash_sessions(&mut c).contains(&"named".to_string()),
        "a named session keeps the full 3 s"
    );
    wait_until("the named sessions are closed", || {
        bash_sessions(&mut c).is_empty()
            && ok(&mut c, "shell/sessions", json!({}))["sessions"]
                .as_object()
                .is_some_and(|m| m.is_empty())
    });
    // Any call but one that creates it: -32002 saying when and why.
    for (method, params, id, why) in [
        ("bash/output", json!({"session_id": "named"}), "named", "3"),
        (
            "bash/kill",
            json!({"session_id": oneshot}),
            &*oneshot,
            "0.5",
        ),
        ("shell/view", json!({"id": "sh"}), "sh", "3"),
    ] {
        let (code, _, data) = err(&mut c, method, params);
        assert_eq!(code, -32002, "{method}");
        let notice = data.expect("data")["notice"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            notice.starts_with(&format!("session {id} was closed at 20"))
                && notice.ends_with(&format!("(idle {why} s)")),
            "{method}: {notice}"
        );
    }
    let (status, body) = http(&d.socket, "POST", "/v1/shell/view", &json!({"id": "sh"}));
    assert_eq!(status, 404, "{body}");
    assert!(
        body.to_string().contains("session sh was closed at"),
        "{body}"
    );
    // A call that creates it makes it again and says so, once.
    let again = |id: &str, why: &str| {
        format!("session {id} was closed (idle {why} s); started again without its earlier state")
    };
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"session_id": "named", "command": "echo back"}),
    );
    assert_eq!(r["stdout"], "back\n");
    assert_eq!(r["notice"], again("named", "3"), "{r}");
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"session_id": "named", "command": "true"}),
    );
    assert!(r.get("notice").is_none(), "said once: {r}");
    let r = ok(
        &mut c,
        "bash/sessions/create",
        json!({"session_id": oneshot}),
    );
    assert_eq!(r["notice"], again(&oneshot, "0.5"), "{r}");
    let (status, body) = http(
        &d.socket,
        "POST",
        "/v1/shell/exec",
        &json!({"id": "sh", "command": "echo hi"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["notice"], again("sh", "3"), "{body}");
    // execctl says it too.
    let o = crate::util::cli::ctl_code(&d, &["exec", "--session", "cli", "true"], 0);
    assert_eq!(
        o.stderr,
        format!("execctl: {}\n", again("cli", "3")),
        "{o:?}"
    );
    assert!(d.log().contains("made again"), "{}", d.log());
    assert_no_panic(&d);
}
