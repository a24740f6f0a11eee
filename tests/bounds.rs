//! Bounds on what any client can make the daemon spend: CPU while nothing happens, memory
//! for output, the size of replies, and kills that end the whole tree (PROTOCOL.md
//! sections 2, 3 and 8).

mod common;

use std::time::Duration;

use common::*;

/// A subscriber of a command that writes nothing costs the daemon no CPU: the loop sleeps
/// in `epoll_wait` instead of polling with a zero timeout. Measured in ticks of CPU time
/// the daemon used (a spinning loop takes one core: about 100 ticks a second).
#[test]
fn quiet_subscribers_cost_no_cpu() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // A terminal that said something first (its subscriber has been fed) and one that never
    // says anything; a bash command likewise.
    let t1 = create(&mut c, "sh", &["-c", "echo hi; exec sleep 30"]);
    let t2 = create(&mut c, "sleep", &["30"]);
    let b1 = ok(
        &mut c,
        "bash/exec",
        json!({"command": "echo hi; exec sleep 30", "async_mode": true}),
    )["command_id"]
        .as_str()
        .expect("command_id")
        .to_string();
    let mut subscribers = Vec::new();
    for id in [&t1, &t2, &b1] {
        for _ in 0..3 {
            let mut s = d.client();
            ok(&mut s, "events/subscribe", json!({"id": id}));
            subscribers.push(s);
        }
    }
    // Let the first output reach its subscribers, then watch the daemon do nothing.
    for s in subscribers.iter_mut().take(3) {
        let e = s.next_notification(Some(WAIT)).expect("the first Output");
        assert_eq!(e["params"]["type"], "Output", "{e}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(d.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(d.pid()) - before;
    // Spinning would be about 300; an idle loop is 0 or 1.
    assert!(
        used <= 15,
        "the daemon used {used} ticks of CPU in 3 s with quiet subscribers"
    );
    drop(subscribers);
}
