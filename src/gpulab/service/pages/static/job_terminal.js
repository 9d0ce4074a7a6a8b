// The job page's terminal panel: a shell in the RUNNING job's container, in xterm.js (vendored
// from npm beside this file: xterm.js, addon-fit.js), over the service's WebSocket
// api/jobs/ID/shell. Binary frames carry the terminal's bytes both ways; the text frame
// {"resize": [cols, rows]} follows the panel's size; the service ends with {"exit": CODE}.
// The handshake carries the page's XSRF token: the service refuses a cookie without it.
// A distributed job's page has a rank chooser (#terminal-rank): the shell opens in that
// worker (?rank=K).
(function () {
  "use strict";
  var page = document.getElementById("job-page");
  var card = document.getElementById("terminal-card");
  if (!page || !card || typeof Terminal === "undefined" || typeof FitAddon === "undefined") return;
  var button = document.getElementById("terminal-open");
  var status = document.getElementById("terminal-status");
  var box = document.getElementById("terminal");
  var encoder = new TextEncoder();
  var term = null, fit = null, ws = null, running = true;

  function say(text) { status.textContent = text; }

  function send(bytes) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(bytes);
  }

  function make() {
    term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
    fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    term.onData(function (data) { send(encoder.encode(data)); });
    term.onBinary(function (data) {  // bytes as a string of code points 0-255 (mouse reports)
      var bytes = new Uint8Array(data.length);
      for (var i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 255;
      send(bytes);
    });
    term.onResize(function (size) {
      if (ws && ws.readyState === WebSocket.OPEN) {
        ws.send(JSON.stringify({ resize: [size.cols, size.rows] }));
      }
    });
    window.addEventListener("resize", function () { if (!box.hidden) fit.fit(); });
  }

  function open() {
    button.disabled = true;
    box.hidden = false;
    if (!term) make(); else term.reset();
    fit.fit();
    var query = new URLSearchParams({ cols: term.cols, rows: term.rows, _xsrf: page.dataset.xsrf });
    // a distributed job: the chosen rank's worker (the service's default is rank 0)
    var rankBox = document.getElementById("terminal-rank");
    var where = "the job's container";
    if (rankBox) {
      query.set("rank", rankBox.value);
      where = "rank " + rankBox.value + "'s container";
    }
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var exitCode = null, opened = false;
    say("connecting…");
    ws = new WebSocket(scheme + location.host + page.dataset.api + "/shell?" + query.toString());
    ws.binaryType = "arraybuffer";
    ws.onopen = function () {
      opened = true;
      say("connected: a shell in " + where + ", as its user");
      card.dataset.connected = "true";
      term.focus();
    };
    ws.onmessage = function (event) {
      if (typeof event.data === "string") {
        try {
          var control = JSON.parse(event.data);
          if (control && "exit" in control) exitCode = control.exit;
        } catch (e) { /* not for us */ }
        return;
      }
      term.write(new Uint8Array(event.data));
    };
    ws.onclose = function () {
      ws = null;
      card.dataset.connected = "false";
      if (opened) {
        term.write("\r\n\x1b[2m[the shell ended" +
                   (exitCode === null ? "" : " with exit code " + exitCode) + "]\x1b[0m\r\n");
        say("ended");
      } else {
        say("could not open a terminal: is the job still running? (reload the page)");
      }
      button.textContent = "Open a new terminal";
      button.disabled = !running;
    };
  }

  button.addEventListener("click", open);

  // the job leaves RUNNING (job.js redraws its badge): no new terminal; an open one ends
  // with the container
  var stateBox = document.getElementById("job-state");
  if (stateBox) {
    new MutationObserver(function () {
      var badge = stateBox.querySelector(".badge");
      if (badge && badge.dataset.state !== "RUNNING") {
        running = false;
        button.disabled = true;
        if (!ws) say("the job is " + badge.dataset.state + ": no terminal");
      }
    }).observe(stateBox, { childList: true, subtree: true });
  }
})();
