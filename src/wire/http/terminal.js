"use strict";
// execd's terminal page (PROTOCOL 12.5). It shows a shell session from the screen frames
// the daemon's own terminal emulator computes (/v1/shell/ws?render=screen), so it needs no
// emulator: each frame says which rows changed, their text and colour runs. Keys, paste
// and the window's size go back as the AIO terminal's messages. Nothing else is fetched.
(function () {
  var bar = document.getElementById("bar");
  var term = document.getElementById("term");
  var screen = document.getElementById("screen");
  var measure = document.getElementById("measure");
  var keys = document.getElementById("keys");

  // The token: from the fragment (#token=T, never sent to a server) or the query.
  function param(text, name) {
    var parts = text.replace(/^[?#]/, "").split("&");
    for (var i = 0; i < parts.length; i++) {
      var kv = parts[i].split("=");
      if (kv[0] === name && kv.length > 1) {
        try { return decodeURIComponent(kv.slice(1).join("=")); } catch (e) { return null; }
      }
    }
    return null;
  }
  var token = param(location.hash, "token") || param(location.search, "token");
  var session = param(location.search, "session_id");

  var ws = null;
  var rows = [];          // per row: {text, runs}
  var size = {rows: 0, cols: 0};
  var cursor = {row: 0, col: 0, visible: true};
  var appCursor = false;
  var retry = 0;
  var closedForGood = false;

  function status(text, bad) {
    bar.textContent = "";
    var b = document.createElement("b");
    b.textContent = "execd";
    bar.appendChild(b);
    bar.appendChild(document.createTextNode(" " + text));
    bar.className = bad ? "off" : "";
  }

  // ---- drawing ------------------------------------------------------------------------

  var BASE = ["#000000", "#cd0000", "#00cd00", "#cdcd00", "#0000ee", "#cd00cd", "#00cdcd",
    "#e5e5e5", "#7f7f7f", "#ff0000", "#00ff00", "#ffff00", "#5c5cff", "#ff00ff", "#00ffff",
    "#ffffff"];
  function hex2(n) { return (n < 16 ? "0" : "") + n.toString(16); }
  function colour(c) {
    if (typeof c === "string") return c;
    if (typeof c !== "number") return null;
    if (c < 16) return BASE[c];
    if (c < 232) {
      var i = c - 16, steps = [0, 95, 135, 175, 215, 255];
      return "#" + hex2(steps[Math.floor(i / 36)]) + hex2(steps[Math.floor(i / 6) % 6]) +
        hex2(steps[i % 6]);
    }
    var g = 8 + (c - 232) * 10;
    return "#" + hex2(g) + hex2(g) + hex2(g);
  }

  // Columns a character takes (wide East Asian characters and emoji take two).
  function width(ch) {
    var c = ch.codePointAt(0);
    return (c >= 0x1100 && c <= 0x115f) || (c >= 0x2e80 && c <= 0xa4cf && c !== 0x303f) ||
      (c >= 0xac00 && c <= 0xd7a3) || (c >= 0xf900 && c <= 0xfaff) ||
      (c >= 0xfe30 && c <= 0xfe4f) || (c >= 0xff00 && c <= 0xff60) ||
      (c >= 0xffe0 && c <= 0xffe6) || (c >= 0x1f300 && c <= 0x1f64f) ||
      (c >= 0x1f900 && c <= 0x1f9ff) || (c >= 0x20000 && c <= 0x3fffd) ? 2 : 1;
  }

  function styled(span, a) {
    var fg = colour(a.fg), bg = colour(a.bg);
    if (a.inverse) {
      var f = fg || "#d0d0d0";
      fg = bg || "#101010";
      bg = f;
    }
    if (fg) span.style.color = fg;
    if (bg) span.style.background = bg;
    if (a.bold) span.style.fontWeight = "bold";
    if (a.dim) span.style.opacity = "0.6";
    if (a.italic) span.style.fontStyle = "italic";
    if (a.underline) span.style.textDecoration = "underline";
  }

  // Draws row `r`: its text in spans by attribute runs, the cursor on it if it is there.
  function draw(r) {
    var div = screen.children[r];
    if (!div) return;
    var line = rows[r] || {text: "", runs: []};
    var chars = Array.from(line.text);
    var attrs = new Array(chars.length);
    (line.runs || []).forEach(function (run) {
      for (var i = run[0]; i < run[0] + run[1] && i < chars.length; i++) attrs[i] = run[2];
    });
    var at = -1;
    if (cursor.row === r) {
      // The cursor's column as a character of the text (past its end: blanks added).
      var col = 0;
      at = 0;
      while (at < chars.length && col + width(chars[at]) <= cursor.col) {
        col += width(chars[at]);
        at++;
      }
      while (col < cursor.col) { chars.push(" "); attrs.push(undefined); col++; at++; }
      if (at === chars.length) { chars.push(" "); attrs.push(undefined); }
    }
    div.textContent = "";
    var i = 0;
    while (i < chars.length) {
      var j = i + 1;
      while (j < chars.length && attrs[j] === attrs[i] && j !== at && i !== at) j++;
      var text = chars.slice(i, j).join("");
      if (!attrs[i] && i !== at) {
        div.appendChild(document.createTextNode(text));
      } else {
        var span = document.createElement("span");
        span.textContent = text;
        if (attrs[i]) styled(span, attrs[i]);
        if (i === at) span.className = cursor.visible ? "cur" : "cur hide";
        div.appendChild(span);
      }
      i = j;
    }
  }

  function frame(f) {
    if (f.rows !== size.rows || f.cols !== size.cols) {
      size = {rows: f.rows, cols: f.cols};
      rows = [];
      screen.textContent = "";
      for (var r = 0; r < f.rows; r++) screen.appendChild(document.createElement("div"));
    }
    var dirty = {};
    dirty[cursor.row] = true;
    (f.lines || []).forEach(function (l) {
      rows[l.row] = {text: l.text, runs: l.runs};
      dirty[l.row] = true;
    });
    cursor = f.cursor || cursor;
    appCursor = !!f.app_cursor;
    dirty[cursor.row] = true;
    Object.keys(dirty).forEach(function (r) { draw(Number(r)); });
  }

  // ---- the window's size -----------------------------------------------------------------

  function fit() {
    var box = measure.getBoundingClientRect();
    var cw = box.width / 10 || 8, ch = box.height || 16;
    var area = term.getBoundingClientRect();
    var cols = Math.max(2, Math.min(1000, Math.floor((area.width - 8) / cw)));
    var rws = Math.max(2, Math.min(1000, Math.floor((area.height - 4) / ch)));
    return {cols: cols, rows: rws};
  }
  var sent = null;
  function resize() {
    var s = fit();
    if (!ws || ws.readyState !== 1) return;
    if (sent && sent.cols === s.cols && sent.rows === s.rows) return;
    sent = s;
    send({type: "resize", data: s});
  }
  var resizeTimer = null;
  function resized() {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(resize, 100);
  }
  window.addEventListener("resize", resized);
  if (window.ResizeObserver) new ResizeObserver(resized).observe(term);

  // ---- keys ------------------------------------------------------------------------------

  function send(msg) {
    if (ws && ws.readyState === 1) ws.send(JSON.stringify(msg));
  }
  function input(data) {
    if (data) send({type: "input", data: data});
  }

  var SPECIAL = {
    Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b",
    Home: "\x1b[H", End: "\x1b[F", Insert: "\x1b[2~", Delete: "\x1b[3~",
    PageUp: "\x1b[5~", PageDown: "\x1b[6~",
    F1: "\x1bOP", F2: "\x1bOQ", F3: "\x1bOR", F4: "\x1bOS", F5: "\x1b[15~", F6: "\x1b[17~",
    F7: "\x1b[18~", F8: "\x1b[19~", F9: "\x1b[20~", F10: "\x1b[21~", F11: "\x1b[23~",
    F12: "\x1b[24~"
  };
  var ARROWS = {ArrowUp: "A", ArrowDown: "B", ArrowRight: "C", ArrowLeft: "D"};

  function keyOf(e) {
    if (ARROWS[e.key]) return (appCursor ? "\x1bO" : "\x1b[") + ARROWS[e.key];
    if (e.key === "Tab" && e.shiftKey) return "\x1b[Z";
    if (SPECIAL[e.key]) return SPECIAL[e.key];
    if (e.key.length !== 1 && Array.from(e.key).length !== 1) return null;
    if (e.ctrlKey && !e.altKey) {
      var k = e.key;
      if (k.length === 1) {
        var c = k.toUpperCase().charCodeAt(0);
        if (c >= 64 && c <= 95) return String.fromCharCode(c - 64);
        if (k === " " || k === "2") return "\x00";
        if (k === "/") return "\x1f";
      }
      return null;
    }
    if (e.altKey && !e.ctrlKey) return "\x1b" + e.key;
    if (e.metaKey) return null;
    return e.key;
  }

  keys.addEventListener("keydown", function (e) {
    if (e.isComposing) return;
    // Copy and paste stay the browser's: Ctrl-Shift-C/V, and Ctrl-V.
    var k = e.key.toLowerCase();
    if (e.ctrlKey && e.shiftKey && (k === "c" || k === "v")) return;
    if ((e.ctrlKey || e.metaKey) && k === "v") return;
    var data = keyOf(e);
    if (data === null) return;
    e.preventDefault();
    input(data);
  });
  keys.addEventListener("compositionend", function (e) {
    input(e.data);
    keys.value = "";
  });
  keys.addEventListener("input", function (e) {
    if (!e.isComposing && e.inputType !== "insertFromPaste") {
      input(keys.value);
    }
    if (!e.isComposing) keys.value = "";
  });
  document.addEventListener("paste", function (e) {
    var text = (e.clipboardData || window.clipboardData).getData("text");
    e.preventDefault();
    keys.value = "";
    // Lines as a terminal sends them: each ended by Enter.
    input(text.replace(/\r\n/g, "\r").replace(/\n/g, "\r"));
  });
  term.addEventListener("mouseup", function () {
    if (!String(window.getSelection())) keys.focus();
  });
  window.addEventListener("focus", function () { keys.focus(); });

  // ---- the connection --------------------------------------------------------------------

  var TOKEN_CHARS = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

  function connect() {
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host +
      "/v1/shell/ws?render=screen";
    if (session) url += "&session_id=" + encodeURIComponent(session);
    var protocols = ["execd"];
    if (token && TOKEN_CHARS.test(token)) {
      protocols.push("execd.token." + token);
    } else if (token) {
      url += "&token=" + encodeURIComponent(token);
    }
    status(session ? "attaching to " + session + "…" : "starting a shell…");
    try {
      ws = new WebSocket(url, protocols);
    } catch (e) {
      status("cannot connect: " + e.message, true);
      return;
    }
    var opened = false;
    ws.onopen = function () {
      opened = true;
      retry = 0;
      sent = null;
      size = {rows: 0, cols: 0};
      resize();
    };
    ws.onmessage = function (ev) {
      var m;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      if (m.type === "screen") {
        frame(m.data);
      } else if (m.type === "session_id") {
        session = m.data;
        document.title = "execd: " + session;
        // A reload comes back to this session (the fragment, with its token, stays).
        var q = "?session_id=" + encodeURIComponent(session);
        var t = param(location.search, "token");
        if (t) q += "&token=" + encodeURIComponent(t);
        history.replaceState(null, "", location.pathname + q + location.hash);
      } else if (m.type === "ready") {
        status("session " + session + (token ? "" : "") + ": connected");
      } else if (m.type === "ping") {
        send({type: "pong", data: {timestamp: m.timestamp}});
      }
    };
    ws.onclose = function (ev) {
      ws = null;
      if (ev.code === 1000) {
        closedForGood = true;
        status("session " + session + ": " + (ev.reason || "closed"), true);
        return;
      }
      if (!opened && retry >= 3) {
        status("cannot connect (no such session, or a wrong token?)", true);
        return;
      }
      retry++;
      var wait = Math.min(5000, 500 * retry);
      status("disconnected" + (ev.reason ? " (" + ev.reason + ")" : "") + "; reconnecting…", true);
      setTimeout(function () { if (!closedForGood) connect(); }, wait);
    };
  }

  keys.focus();
  connect();
})();
