//! The one reader of a command's `Output`, `Gap` and `Exit` events (lossless base64
//! subscriptions), for `run`, `exec` and `logs`: it decodes each chunk, drops bytes a
//! chunk repeats, and turns whatever never arrived (a `Gap`, an offset that jumps, a
//! chunk that is not base64) into a counted loss, so every caller reports output alike.

use serde_json::Value;

use crate::wire::encode::base64_decode;

/// What one message meant for the followed command.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// New bytes of `stream` (0: stdout or a terminal's output, 1: stderr), the first at
    /// `offset`.
    Bytes {
        stream: usize,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// `skipped` bytes of `stream` (named `name`) from `offset` will never arrive.
    Lost {
        stream: usize,
        name: String,
        offset: u64,
        skipped: u64,
    },
    /// A chunk of `stream` that is not base64: its bytes are lost (the next chunk's
    /// offset says how many).
    Garbled { stream: usize },
    /// The command's `Exit` payload.
    Exit(Value),
    /// It started (true) or stopped (false) waiting for input (PROTOCOL 12.3).
    Input(bool),
    /// Not an event of this command, or nothing new.
    Nothing,
}

/// Follows one command's streams by offset.
#[derive(Debug)]
pub struct Decoder {
    id: String,
    /// The next offset expected on each stream.
    pub next: [u64; 2],
}

impl Decoder {
    pub fn new(id: &str) -> Decoder {
        Decoder {
            id: id.to_string(),
            next: [0, 0],
        }
    }

    /// Reads one message: what it brings, in order (a chunk that skips ahead reports what
    /// it skipped first, then its bytes).
    pub fn decode(&mut self, msg: &Value) -> Vec<Decoded> {
        let params = &msg["params"];
        let payload = &params["payload"];
        if msg["method"] != "event" || payload["id"] != self.id.as_str() {
            return vec![Decoded::Nothing];
        }
        let name = payload["stream"].as_str().unwrap_or("output").to_string();
        let stream = usize::from(name == "stderr");
        let next = self.next[stream];
        match params["type"].as_str() {
            Some("Output") => {
                let offset = payload["offset"].as_u64().unwrap_or(next);
                let Some(mut bytes) = payload["data"].as_str().and_then(base64_decode) else {
                    return vec![Decoded::Garbled { stream }];
                };
                let mut out = Vec::new();
                if offset > next {
                    out.push(Decoded::Lost {
                        stream,
                        name,
                        offset: next,
                        skipped: offset - next,
                    });
                } else if offset < next {
                    // Already delivered: keep only what is new.
                    let seen = ((next - offset) as usize).min(bytes.len());
                    bytes.drain(..seen);
                }
                let start = offset.max(next);
                self.next[stream] = start + bytes.len() as u64;
                if !bytes.is_empty() {
                    out.push(Decoded::Bytes {
                        stream,
                        offset: start,
                        bytes,
                    });
                }
                if out.is_empty() {
                    out.push(Decoded::Nothing);
                }
                out
            }
            Some("Gap") => {
                let offset = payload["offset"].as_u64().unwrap_or(next);
                let skipped = payload["skipped"].as_u64().unwrap_or(0);
                let end = offset + skipped;
                if end <= next {
                    return vec![Decoded::Nothing];
                }
                self.next[stream] = end;
                let from = offset.max(next);
                vec![Decoded::Lost {
                    stream,
                    name,
                    offset: from,
                    skipped: end - from,
                }]
            }
            Some("Exit") => vec![Decoded::Exit(payload.clone())],
            Some("Input") => vec![Decoded::Input(payload["waiting"] == true)],
            _ => vec![Decoded::Nothing],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn output(id: &str, stream: &str, offset: u64, data: &str) -> Value {
        json!({"jsonrpc": "2.0", "method": "event", "params": {"type": "Output", "payload":
            {"id": id, "stream": stream, "offset": offset, "encoding": "base64", "data": data}}})
    }

    #[test]
    fn chunks_are_decoded_repeats_dropped_and_jumps_counted() {
        let mut d = Decoder::new("cmd_1");
        // "abc" at 0, then "bcd" at 1 (two repeated bytes), then "f" at 5 (one missing).
        assert_eq!(
            d.decode(&output("cmd_1", "stdout", 0, "YWJj")),
            [Decoded::Bytes {
                stream: 0,
                offset: 0,
                bytes: b"abc".to_vec()
            }]
        );
        assert_eq!(
            d.decode(&output("cmd_1", "stdout", 1, "YmNk")),
            [Decoded::Bytes {
                stream: 0,
                offset: 3,
                bytes: b"d".to_vec()
            }]
        );
        assert_eq!(
            d.decode(&output("cmd_1", "stdout", 5, "Zg==")),
            [
                Decoded::Lost {
                    stream: 0,
                    name: "stdout".into(),
                    offset: 4,
                    skipped: 1
                },
                Decoded::Bytes {
                    stream: 0,
                    offset: 5,
                    bytes: b"f".to_vec()
                },
            ]
        );
        assert_eq!(d.next, [6, 0]);
        // Other commands, and chunks that are not base64, bring nothing.
        assert_eq!(
            d.decode(&output("cmd_2", "stdout", 6, "Zg==")),
            [Decoded::Nothing]
        );
        assert_eq!(
            d.decode(&output("cmd_1", "stderr", 0, "!!")),
            [Decoded::Garbled { stream: 1 }]
        );
        assert_eq!(
            d.decode(&output("cmd_1", "stderr", 2, "eA==")),
            [
                Decoded::Lost {
                    stream: 1,
                    name: "stderr".into(),
                    offset: 0,
                    skipped: 2
                },
                Decoded::Bytes {
                    stream: 1,
                    offset: 2,
                    bytes: b"x".to_vec()
                },
            ]
        );
    }

    #[test]
    fn gaps_count_only_what_was_not_had_and_exit_ends() {
        let mut d = Decoder::new("t");
        let gap = |offset: u64, skipped: u64| {
            json!({"method": "event", "params": {"type": "Gap", "payload":
                {"id": "t", "stream": "output", "offset": offset, "skipped": skipped}}})
        };
        assert_eq!(
            d.decode(&gap(0, 10)),
            [Decoded::Lost {
                stream: 0,
                name: "output".into(),
                offset: 0,
                skipped: 10
            }]
        );
        assert_eq!(d.decode(&gap(5, 5)), [Decoded::Nothing], "already counted");
        let exit = json!({"method": "event", "params": {"type": "Exit", "payload": {"id": "t"}}});
        assert_eq!(d.decode(&exit), [Decoded::Exit(json!({"id": "t"}))]);
    }
}
