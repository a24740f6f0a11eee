"""Drives the AIO sandbox's Python SDK (PyPI `agent-sandbox`) through its `shell` client
against execd's `/v1/shell/*` (PROTOCOL 12.2), unmodified.

Run by tests/shell.rs inside the virtualenv tests/http.rs makes for the pinned SDK:

    shell_drive.py --base-url http://127.0.0.1:PORT --token TOKEN
    shell_drive.py --uds /path/to/execd.sock

Every method of the client: sessions (create, update, list, stats, cleanup one and all),
exec (sync with cd and export persisting, exit codes, async then wait_for_process, soft,
hard and no-change timeouts, no_change_timeout at once for a command reading its input,
exec_dir with and without strict, truncate), view,
write_to_process feeding `read` and an interactive `python3 -q`, kill_process of
`sleep 30` leaving the session usable, colour codes stripped. An error must raise
`ApiError` (or its `UnprocessableEntityError` for a 422).

Prints one line per failed check and exits 1 if any failed, 0 otherwise.
"""

import time

from checks import check, check_true, expect_error, main

# Longer than any wait below, shorter than the Rust test's own bound on this script.
HTTP_TIMEOUT = 60.0


def poll_view(shell, sid, until, what, bound=20.0):
    """`view` until `until(output)` holds (bounded); the last view."""
    deadline = time.monotonic() + bound
    while True:
        v = shell.view(id=sid).data
        if until(v.output) or time.monotonic() > deadline:
            check_true(what, until(v.output), f"last output {v.output!r}")
            return v
        time.sleep(0.05)


def drive(client, tag):
    shell = client.shell
    sid = f"sdk-{tag}"

    # A session in a directory, and the state it keeps.
    created = shell.create_session(id=sid, exec_dir="/tmp")
    check(f"{tag} create.success", created.success, True)
    check(f"{tag} create.session_id", created.data.session_id, sid)
    check(f"{tag} create.working_dir", created.data.working_dir, "/tmp")
    again = shell.create_session(id=sid).data
    check(f"{tag} create of an existing id", again.session_id, sid)

    r = shell.exec_command(id=sid, command="cd /usr && export EXECD_T=kept").data
    check(f"{tag} cd+export status", r.status, "completed")
    check(f"{tag} cd+export exit_code", r.exit_code, 0)
    check(f"{tag} cd+export session_id", r.session_id, sid)
    r = shell.exec_command(id=sid, command='pwd; echo "$EXECD_T"').data
    check(f"{tag} cd and export persist", r.output, "/usr\nkept\n")
    listed = shell.list_sessions().data.sessions
    check(f"{tag} working_dir follows cd", listed[sid].working_dir if sid in listed else None, "/usr")

    # Exit codes are codes, not errors.
    r = shell.exec_command(id=sid, command="false").data
    check(f"{tag} false", (r.status, r.exit_code), ("completed", 1))
    r = shell.exec_command(id=sid, command="(exit 3)").data
    check(f"{tag} (exit 3)", (r.status, r.exit_code), ("completed", 3))

    # The console: every record, oldest first, the last one included.
    v = shell.view(id=sid).data
    check(f"{tag} view.session_id", v.session_id, sid)
    check(f"{tag} view.status", v.status, "completed")
    check(f"{tag} view.command", v.command, "(exit 3)")
    check(f"{tag} view.exit_code", v.exit_code, 3)
    commands = [c.command for c in (v.console or [])]
    check(
        f"{tag} console commands",
        commands,
        ["cd /usr && export EXECD_T=kept", 'pwd; echo "$EXECD_T"', "false", "(exit 3)"],
    )
    check_true(
        f"{tag} console prompts",
        all(isinstance(c.ps_1, str) and c.ps_1 for c in (v.console or [])),
        repr(v.console),
    )
    check(f"{tag} console output", (v.console or [None])[1].output if v.console else None, "/usr\nkept\n")

    # No id: a new session.
    r = shell.exec_command(command="echo fresh").data
    check_true(f"{tag} new session id", isinstance(r.session_id, str) and r.session_id and r.session_id != sid, repr(r.session_id))
    check(f"{tag} new session output", r.output, "fresh\n")

    # async_mode, then wait_for_process.
    r = shell.exec_command(id=sid, command="sleep 1; echo done", async_mode=True).data
    check(f"{tag} async status", r.status, "running")
    w = shell.wait_for_process(id=sid, seconds=15).data
    check(f"{tag} wait_for_process", w.status, "completed")
    v = shell.view(id=sid).data
    check(f"{tag} async output", (v.output, v.exit_code), ("done\n", 0))

    # A soft timeout answers running; the command goes on.
    r = shell.exec_command(id=sid, command="sleep 1; echo late", timeout=0.2).data
    check(f"{tag} soft timeout status", r.status, "running")
    w = shell.wait_for_process(id=sid, seconds=10, max_wait_seconds=15).data
    check(f"{tag} soft timeout then wait", w.status, "completed")
    check(f"{tag} soft timeout output", shell.view(id=sid).data.output, "late\n")

    # write_to_process feeds `read`.
    r = shell.exec_command(id=sid, command='read -r line; echo "got $line"', async_mode=True).data
    check(f"{tag} read status", r.status, "running")
    w = shell.write_to_process(id=sid, input="hello there", press_enter=True)
    check(f"{tag} write.success", w.success, True)
    check(f"{tag} write.status", w.data.status, "running")
    check(f"{tag} read then wait", shell.wait_for_process(id=sid, seconds=15).data.status, "completed")
    v = shell.view(id=sid).data
    check_true(f"{tag} read got the line", v.output.endswith("got hello there\n"), repr(v.output))

    # A command waiting for input answers no_change_timeout at once (PROTOCOL 12.3), not
    # after the default 30 s; it goes on, and takes what is written.
    started = time.monotonic()
    r = shell.exec_command(id=sid, command='read -r x; echo "x=$x"').data
    check(f"{tag} read at once status", r.status, "no_change_timeout")
    check_true(f"{tag} read at once in time", time.monotonic() - started < 5, f"{time.monotonic() - started:.2f} s")
    check(f"{tag} read at once waiting_for_input", getattr(r, "waiting_for_input", None), True)
    shell.write_to_process(id=sid, input="given", press_enter=True)
    check(f"{tag} read at once then wait", shell.wait_for_process(id=sid, seconds=15).data.status, "completed")
    check_true(f"{tag} read at once output", shell.view(id=sid).data.output.endswith("x=given\n"), "")

    # Nothing running: write is refused (commands go through exec and the gate).
    expect_error(
        f"{tag} write at the prompt",
        lambda: shell.write_to_process(id=sid, input="rm -rf /", press_enter=True),
        400,
        False,
    )

    # kill_process of `sleep 30` leaves the session usable.
    r = shell.exec_command(id=sid, command="sleep 30", async_mode=True).data
    check(f"{tag} sleep 30 status", r.status, "running")
    time.sleep(0.5)
    started = time.monotonic()
    k = shell.kill_process(id=sid).data
    check(f"{tag} kill.status", k.status, "terminated")
    check(f"{tag} kill.exit_code", k.exit_code, 130)
    check(f"{tag} kill.returncode", k.returncode, k.exit_code)
    check_true(f"{tag} kill is quick", time.monotonic() - started < 5, "took too long")
    r = shell.exec_command(id=sid, command='echo alive; echo "$EXECD_T"').data
    check(f"{tag} usable after kill", r.output, "alive\nkept\n")
    expect_error(f"{tag} kill with nothing running", lambda: shell.kill_process(id=sid), 400, False)

    # hard_timeout kills the command, not the session.
    started = time.monotonic()
    r = shell.exec_command(id=sid, command="sleep 30", hard_timeout=1).data
    check(f"{tag} hard_timeout status", r.status, "hard_timeout")
    check_true(f"{tag} hard_timeout in time", time.monotonic() - started < 10, "too slow")
    r = shell.exec_command(id=sid, command='echo "$EXECD_T"').data
    check(f"{tag} session kept after hard_timeout", r.output, "kept\n")

    # no_change_timeout: no output for that long answers at once; the command goes on.
    started = time.monotonic()
    r = shell.exec_command(id=sid, command="sleep 3; echo woke", no_change_timeout=1).data
    elapsed = time.monotonic() - started
    check(f"{tag} no_change_timeout status", r.status, "no_change_timeout")
    check_true(f"{tag} no_change_timeout in time", 0.8 < elapsed < 2.9, f"{elapsed:.2f} s")
    check(f"{tag} no_change_timeout then wait", shell.wait_for_process(id=sid, seconds=15).data.status, "completed")
    check(f"{tag} no_change_timeout output", shell.view(id=sid).data.output, "woke\n")
    u = shell.update_session(id=sid, no_change_timeout=1)
    check(f"{tag} update.success", u.success, True)
    started = time.monotonic()
    r = shell.exec_command(id=sid, command="sleep 3").data
    check(f"{tag} session no_change_timeout", r.status, "no_change_timeout")
    check_true(f"{tag} session no_change_timeout in time", time.monotonic() - started < 2.9, "too slow")
    shell.wait_for_process(id=sid, seconds=15)

    # An interactive python3 driven through write and view.
    r = shell.exec_command(id=sid, command="python3 -q", async_mode=True).data
    check(f"{tag} python3 status", r.status, "running")
    poll_view(shell, sid, lambda out: out.endswith(">>> "), f"{tag} python3 prompt")
    shell.write_to_process(id=sid, input="print(6 * 7)", press_enter=True)
    poll_view(shell, sid, lambda out: "42\n>>> " in out, f"{tag} python3 answer")
    shell.write_to_process(id=sid, input="exit()", press_enter=True)
    check(f"{tag} python3 exits", shell.wait_for_process(id=sid, seconds=15).data.status, "completed")

    # Colour codes are stripped.
    r = shell.exec_command(id=sid, command=r"printf '\033[1;31mred\033[0m plain\n'").data
    check(f"{tag} colours stripped", r.output, "red plain\n")

    # The 30,000-character cut, and truncate: false.
    big = "head -c 40000 /dev/zero | tr '\\0' x; echo"
    r = shell.exec_command(id=sid, command=big).data
    check_true(
        f"{tag} truncated output",
        30000 <= len(r.output) < 30100 and "omitted" in r.output and r.output.endswith("x\n"),
        f"{len(r.output)} chars",
    )
    r = shell.exec_command(id=sid, command=big, truncate=False).data
    check(f"{tag} truncate false", r.output, "x" * 40000 + "\n")

    # exec_dir: that one command there, the session's directory unchanged; strict refuses
    # a missing one, else it runs in the session's directory.
    r = shell.exec_command(id=sid, command="pwd", exec_dir="/").data
    check(f"{tag} exec_dir", r.output, "/\n")
    check(f"{tag} exec_dir leaves the session", shell.exec_command(id=sid, command="pwd").data.output, "/usr\n")
    r = shell.exec_command(id=sid, command="pwd", exec_dir="/no/such/dir").data
    check(f"{tag} missing exec_dir, not strict", r.output, "/usr\n")
    body = expect_error(
        f"{tag} missing exec_dir, strict",
        lambda: shell.exec_command(id=sid, command="pwd", exec_dir="/no/such/dir", strict=True),
        422,
        True,
    )
    if body is not None:
        check(f"{tag} strict loc", [list(d.loc) for d in body.detail], [["body", "exec_dir"]])

    # Listing and stats.
    listed = shell.list_sessions().data.sessions
    check_true(f"{tag} listed", sid in listed, repr(listed))
    if sid in listed:
        info = listed[sid]
        check(f"{tag} listed current_command", info.current_command, None)
        check_true(f"{tag} listed age", info.age_seconds >= 0, repr(info.age_seconds))
        check_true(f"{tag} listed status", isinstance(info.status, str) and info.status, repr(info.status))
    stats = shell.get_session_stats().data
    check_true(f"{tag} stats total", stats.total_sessions >= 2, repr(stats))
    check(f"{tag} stats active + idle", stats.active_sessions + stats.idle_sessions, stats.total_sessions)
    check(f"{tag} stats max_sessions", stats.max_sessions, 256)
    check(f"{tag} stats session_timeout", stats.session_timeout, 3600)
    check_true(f"{tag} stats usage_ratio", 0 < stats.usage_ratio <= 1, repr(stats.usage_ratio))

    # Closing: one, then all; an unknown one is 404.
    c = shell.cleanup_session(sid)
    check(f"{tag} cleanup_session.success", c.success, True)
    expect_error(f"{tag} view of a closed session", lambda: shell.view(id=sid), 404, False)
    expect_error(f"{tag} cleanup of an unknown session", lambda: shell.cleanup_session("no-such-session"), 404, False)
    a = shell.cleanup_all_sessions()
    check(f"{tag} cleanup_all_sessions.success", a.success, True)
    check(f"{tag} nothing left", shell.list_sessions().data.sessions, {})


if __name__ == "__main__":
    main(drive, HTTP_TIMEOUT)
