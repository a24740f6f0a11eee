"""What drive.py and shell_drive.py share: the failures found, the checks that add to
them, and `main`, which builds the SDK's client for the transport given on the command
line, drives it, prints one line per failed check and exits 1 if any failed, 0 otherwise.

Imported from the scripts' own directory (Python puts a script's directory first on
`sys.path`), inside the virtualenv that holds the pinned SDK.
"""

import argparse
import os
import sys
import traceback

import httpx
from agent_sandbox import Sandbox, UnprocessableEntityError
from agent_sandbox.core.api_error import ApiError

FAILURES = []


def check(what, got, expected):
    if got != expected:
        FAILURES.append(f"{what}: got {got!r}, expected {expected!r}")


def check_true(what, cond, detail=""):
    if not cond:
        FAILURES.append(f"{what}: {detail}")


def expect_error(what, call, status, unprocessable):
    """`call()` must raise ApiError with `status` (UnprocessableEntityError when
    `unprocessable`); returns the exception's body."""
    try:
        value = call()
    except UnprocessableEntityError as e:
        check(f"{what}: raised UnprocessableEntityError", unprocessable, True)
        check(f"{what}: status", e.status_code, status)
        return e.body
    except ApiError as e:
        check(f"{what}: raised plain ApiError", unprocessable, False)
        check(f"{what}: status", e.status_code, status)
        body = e.body
        if isinstance(body, dict):
            check(f"{what}: body.success", body.get("success"), False)
            check(f"{what}: body.hint", body.get("hint"), None)
            check_true(f"{what}: body.message", isinstance(body.get("message"), str), repr(body))
        else:
            FAILURES.append(f"{what}: error body is not a JSON object: {body!r}")
        return body
    FAILURES.append(f"{what}: returned {value!r} instead of raising ApiError")
    return None


def main(drive, http_timeout):
    """Runs `drive(client, tag)` against the transport the command line names:
    `--base-url URL --token TOKEN` (TCP) or `--uds PATH` (the Unix socket). Every request
    is bounded by `http_timeout` (a bare httpx.Client would give up after 5 s, shorter
    than a long poll)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url")
    parser.add_argument("--token")
    parser.add_argument("--uds")
    args = parser.parse_args()
    if args.uds:
        transport = httpx.HTTPTransport(uds=args.uds)
        http = httpx.Client(transport=transport, timeout=http_timeout)
        client = Sandbox(base_url="http://execd", httpx_client=http)
        tag = "uds"
    else:
        headers = {"Authorization": f"Bearer {args.token}"}
        client = Sandbox(base_url=args.base_url, headers=headers, timeout=http_timeout)
        tag = "tcp"
    try:
        drive(client, tag)
    except Exception:
        FAILURES.append(f"{tag}: unexpected exception:\n{traceback.format_exc()}")
    for f in FAILURES:
        print(f"FAILED {f}")
    if not FAILURES:
        print(f"{tag}: every check passed")
    sys.stdout.flush()
    os._exit(1 if FAILURES else 0)
