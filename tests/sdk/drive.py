"""Drives the bash pipe API's own Python SDK (PyPI `agent-sandbox`) against execd.

Run by tests/http.rs inside a virtualenv that holds the pinned SDK:

    drive.py --base-url http://127.0.0.1:PORT --token TOKEN
    drive.py --uds /path/to/execd.sock

For the one transport it is given, it goes through `Sandbox.bash`: a synchronous exec
(the seed's SDK example), a soft timeout followed by `output` with `wait`, an async exec
fed by `write` and ended by `kill`, the sessions calls (list, create, close, a session id
that needs percent-encoding), and errors. An error must raise `ApiError` (or its
`UnprocessableEntityError` for a 422) and never come back as a value with
`success: false`.

Prints one line per failed check and exits 1 if any failed, 0 otherwise. Every request is
bounded by the httpx timeout (a bare httpx.Client would give up after 5 s, shorter than a
long poll, so it is set explicitly).
"""

import datetime

from checks import check, check_true, expect_error, main

# Longer than any wait below (the longest is the 10 s wait_timeout), shorter than the
# Rust test's own bound on this script.
HTTP_TIMEOUT = 30.0


def check_envelope(what, response):
    """The SDK's `Response[...]` model: success true, a message, no hint."""
    check(f"{what}.success", response.success, True)
    check_true(f"{what}.message", isinstance(response.message, str), repr(response.message))
    check(f"{what}.hint", response.hint, None)


def drive(client, tag):
    bash = client.bash

    # The seed's SDK example, as written there.
    result = bash.exec(
        command='printf "out\\n" && printf "err\\n" >&2',
        timeout=30,
        hard_timeout=120,
    )
    check_envelope(f"{tag} exec", result)
    r = result.data
    check(f"{tag} exec.command", r.command, 'printf "out\\n" && printf "err\\n" >&2')
    check(f"{tag} exec.status", r.status, "completed")
    check(f"{tag} exec.stdout", r.stdout, "out\n")
    check(f"{tag} exec.stderr", r.stderr, "err\n")
    check(f"{tag} exec.exit_code", r.exit_code, 0)
    check(f"{tag} exec.offset", r.offset, 4)
    check(f"{tag} exec.stderr_offset", r.stderr_offset, 4)
    check_true(f"{tag} exec.session_id", isinstance(r.session_id, str) and r.session_id, repr(r.session_id))
    check_true(f"{tag} exec.command_id", isinstance(r.command_id, str) and r.command_id, repr(r.command_id))

    # A non-zero exit is still a completed command, not an error.
    r = bash.exec(command="exit 7").data
    check(f"{tag} exit 7 status", r.status, "completed")
    check(f"{tag} exit 7 exit_code", r.exit_code, 7)

    # Soft timeout, then a long poll for the rest (the seed's "long command" example).
    r = bash.exec(command="sleep 2; echo done", timeout=0.5, hard_timeout=30).data
    check(f"{tag} soft timeout status", r.status, "running")
    check(f"{tag} soft timeout exit_code", r.exit_code, None)
    sid, cid = r.session_id, r.command_id
    offset, stderr_offset, stdout, status = 0, 0, "", "running"
    for _ in range(10):
        o = bash.output(
            session_id=sid, offset=offset, stderr_offset=stderr_offset, wait=True, wait_timeout=10
        )
        check_envelope(f"{tag} output", o)
        o = o.data
        check(f"{tag} output.session_id", o.session_id, sid)
        check(f"{tag} output.command.command_id", o.command.command_id, cid)
        check(f"{tag} output.command.command", o.command.command, "sleep 2; echo done")
        stdout += o.stdout
        check(f"{tag} output.offset", o.offset, len(stdout.encode()))
        check(f"{tag} output.stderr", o.stderr, "")
        offset, stderr_offset, status = o.offset, o.stderr_offset, o.command.status
        if status != "running":
            check(f"{tag} output.command.exit_code", o.command.exit_code, 0)
            break
    check(f"{tag} long command status", status, "completed")
    check(f"{tag} long command stdout", stdout, "done\n")

    # async_mode + write + output(wait) + kill, on `cat`.
    r = bash.exec(command="cat", async_mode=True, hard_timeout=120).data
    check(f"{tag} async status", r.status, "running")
    check(f"{tag} async stdout", r.stdout or "", "")
    sid, cid = r.session_id, r.command_id
    w = bash.write(session_id=sid, input="hello from stdin\n")
    check_envelope(f"{tag} write", w)
    check(f"{tag} write.data", w.data, {"written": 17})
    o = bash.output(session_id=sid, offset=0, wait=True, wait_timeout=10).data
    check(f"{tag} cat stdout", o.stdout, "hello from stdin\n")
    check(f"{tag} cat offset", o.offset, 17)
    check(f"{tag} cat command.status", o.command.status, "running")
    o = bash.output(session_id=sid, command_id=cid, offset=17).data
    check(f"{tag} cat stdout past the end", o.stdout, "")
    check(f"{tag} cat offset past the end", o.offset, 17)
    k = bash.kill(session_id=sid, signal="SIGTERM")
    check_envelope(f"{tag} kill", k)
    check(
        f"{tag} kill.data",
        k.data,
        {"command_id": cid, "command": "cat", "status": "killed", "exit_code": None, "signal": "SIGTERM"},
    )

    # Sessions: create (with a directory), list, close; an id with a space goes through
    # the path percent-encoded.
    for session_id in (f"sdk-{tag}", f"sdk {tag}"):
        s = bash.create_session(session_id=session_id, exec_dir="/tmp")
        check_envelope(f"{tag} create_session", s)
        s = s.data
        check(f"{tag} create_session.session_id", s.session_id, session_id)
        check(f"{tag} create_session.status", s.status, "ready")
        check(f"{tag} create_session.working_dir", s.working_dir, "/tmp")
        check(f"{tag} create_session.command_count", s.command_count, 0)
        check(f"{tag} create_session.current_command", s.current_command, None)
        check_true(
            f"{tag} create_session.created_at",
            isinstance(s.created_at, datetime.datetime) and s.created_at.utcoffset() == datetime.timedelta(0),
            repr(s.created_at),
        )
        r = bash.exec(session_id=session_id, command="pwd").data
        check(f"{tag} exec in {session_id!r}", (r.session_id, r.stdout), (session_id, "/tmp\n"))
        listed = bash.sessions()
        check_envelope(f"{tag} sessions", listed)
        mine = [x for x in listed.data if x.session_id == session_id]
        check(f"{tag} sessions lists {session_id!r}", len(mine), 1)
        if mine:
            check(f"{tag} listed command_count", mine[0].command_count, 1)
            check(f"{tag} listed working_dir", mine[0].working_dir, "/tmp")
        c = bash.close_session(session_id)
        check_envelope(f"{tag} close_session", c)
        check(f"{tag} close_session.data", c.data, {})
        ids = [x.session_id for x in bash.sessions().data]
        check_true(f"{tag} closed session gone", session_id not in ids, repr(ids))

    # Errors raise; none comes back as `success: false`.
    expect_error(f"{tag} output of an unknown session", lambda: bash.output(session_id="no-such-session"), 404, False)
    expect_error(f"{tag} close of an unknown session", lambda: bash.close_session("no-such-session"), 404, False)
    r = bash.exec(command="true").data
    expect_error(f"{tag} write with nothing running", lambda: bash.write(session_id=r.session_id, input="x"), 400, False)
    body = expect_error(f"{tag} empty command", lambda: bash.exec(command=""), 422, True)
    if body is not None:
        check(f"{tag} empty command loc", [list(d.loc) for d in body.detail], [["body", "command"]])
    body = expect_error(f"{tag} unknown signal", lambda: bash.kill(session_id=r.session_id, signal="SIGBOGUS"), 422, True)
    if body is not None:
        check(f"{tag} unknown signal loc", [list(d.loc) for d in body.detail], [["body", "signal"]])
    body = expect_error(
        f"{tag} snapshot_path", lambda: bash.create_session(snapshot_path="/tmp/snapshot.sh"), 422, True
    )
    if body is not None:
        check(f"{tag} snapshot_path loc", [list(d.loc) for d in body.detail], [["body", "snapshot_path"]])
    body = expect_error(f"{tag} relative exec_dir", lambda: bash.exec(command="pwd", exec_dir="tmp"), 422, True)
    if body is not None:
        check(f"{tag} relative exec_dir loc", [list(d.loc) for d in body.detail], [["body", "exec_dir"]])


if __name__ == "__main__":
    main(drive, HTTP_TIMEOUT)
