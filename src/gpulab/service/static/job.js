// The job page: follow the job's log (fetch + ReadableStream) and keep its state and events
// current by polling the JSON API. No framework, no build step.
(function () {
  "use strict";
  var page = document.getElementById("job-page");
  if (!page) return;
  var api = page.dataset.api;
  var ended = page.dataset.ended.split(",");
  var state = page.dataset.state;
  var headers = { "X-XSRFToken": page.dataset.xsrf };
  var logs = document.getElementById("logs");
  var logStatus = document.getElementById("log-status");

  function isEnded(s) { return ended.indexOf(s) >= 0; }
  function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
  function text(id, value) { var e = document.getElementById(id); if (e) e.textContent = value; }
  function when(iso) { return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("Z", "") : ""; }
  function badgeClass(s) {
    if (s === "DONE") return "ok";
    if (s === "RUNNING") return "run";
    if (["FAILED", "ERROR", "SYNC_FAILED", "TIMEOUT"].indexOf(s) >= 0) return "bad";
    if (["STOPPED", "INTERRUPTED"].indexOf(s) >= 0) return "off";
    return "wait";
  }
  function badge(s) {
    var b = document.createElement("span");
    b.className = "badge " + badgeClass(s); b.dataset.state = s; b.textContent = s;
    return b;
  }

  async function followLogs() {
    // While the job lives, follow its container's output; a stream ends when the container
    // stops (a restart, or the end): then read the whole log again, until the job has ended.
    for (;;) {
      var follow = !isEnded(state);
      logStatus.textContent = follow ? "live" : "complete";
      logStatus.className = follow ? "live" : "muted";
      try {
        var resp = await fetch(api + "/logs" + (follow ? "?follow=true" : ""),
                               { headers: headers, credentials: "same-origin" });
        if (!resp.ok) { logStatus.textContent = "logs unavailable (HTTP " + resp.status + ")"; return; }
        var reader = resp.body.getReader(), decoder = new TextDecoder(), first = true;
        for (;;) {
          var chunk = await reader.read();
          if (first) { logs.textContent = ""; first = false; }
          if (chunk.done) break;
          var atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
          logs.textContent += decoder.decode(chunk.value, { stream: true });
          if (atBottom) logs.scrollTop = logs.scrollHeight;
        }
        if (!logs.textContent) logs.textContent = follow ? "(waiting for output…)" : "(no output)";
      } catch (e) {
        logStatus.textContent = "connection lost; retrying";
      }
      if (!follow) return;
      await sleep(1000);
    }
  }

  function renderEvents(events) {
    var body = document.querySelector("#events tbody");
    body.textContent = "";
    events.forEach(function (e) {
      var tr = document.createElement("tr");
      [when(e.at), e.kind, null, e.reason || "", e.message || "",
       e.exit_code === null || e.exit_code === undefined ? "" : String(e.exit_code)
      ].forEach(function (v, i) {
        var td = document.createElement("td");
        if (i === 0) td.className = "mono";
        if (i === 5) td.className = "num";
        if (i === 2) { if (e.state) td.appendChild(badge(e.state)); } else td.textContent = v;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }

  async function pollJob() {
    while (!isEnded(state)) {
      await sleep(1500);
      try {
        var resp = await fetch(api, { headers: headers, credentials: "same-origin" });
        if (!resp.ok) continue;
        var job = await resp.json();
        var box = document.getElementById("job-state");
        box.textContent = ""; box.appendChild(badge(job.state));
        var msg = document.getElementById("job-message");
        msg.textContent = "";
        if (job.reason) { var b = document.createElement("b"); b.textContent = job.reason; msg.appendChild(b); }
        msg.appendChild(document.createTextNode(" " + (job.message || "")));
        if (job.exit_code !== null && (job.message || "").indexOf("exit code") < 0) {
          msg.appendChild(document.createTextNode(" (exit code " + job.exit_code + ")"));
        }
        text("job-devices", job.devices.join(", ") || "—");
        text("job-restarts", String(job.restarts));
        text("job-billed", String(job.billed_minutes));
        text("job-running-since", job.running_since ? when(job.running_since) + " UTC" : "—");
        if (job.history) renderEvents(job.history);
        var changed = job.state !== state;
        state = job.state;
        if (changed && isEnded(state)) {
          // the end: nothing left to interrupt; resume or retry the push where it applies
          var gone = document.getElementById("form-interrupt");
          if (gone) gone.remove();
          if (state === "INTERRUPTED" || state === "SYNC_FAILED") { location.reload(); return; }
        }
      } catch (e) { /* try again */ }
    }
  }

  followLogs();
  pollJob();
})();
