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

  // A distributed job: whose output is shown (every rank's, prefixed, or one rank's)
  var rankSel = document.getElementById("log-rank");
  var generation = 0, controller = null;
  function shownRank() { return rankSel ? rankSel.value : ""; }
  function logsUrl(follow) {
    var q = [];
    if (follow) q.push("follow=true");
    if (shownRank() !== "") q.push("rank=" + encodeURIComponent(shownRank()));
    return api + "/logs" + (q.length ? "?" + q.join("&") : "");
  }

  async function followLogs(gen) {
    // While the job lives, follow its container's output; a stream ends when the container
    // stops (a restart, or the end): then read the whole log again, until the job has ended.
    // Another rank chosen starts a new generation: this one stops at its next step.
    for (;;) {
      if (gen !== generation) return;
      var follow = !isEnded(state);
      // "complete" only once the ended job's whole log is on the page (below)
      logStatus.textContent = follow ? "live" : "loading…";
      logStatus.className = follow ? "live" : "muted";
      try {
        controller = window.AbortController ? new AbortController() : null;
        var resp = await fetch(logsUrl(follow), { headers: headers, credentials: "same-origin",
                                                  signal: controller ? controller.signal : undefined });
        if (gen !== generation) return;
        if (!resp.ok) {
          var why = "";
          try { why = (await resp.json()).message || ""; } catch (e) { /* not JSON */ }
          logStatus.className = "muted";
          logStatus.textContent = "logs unavailable (HTTP " + resp.status + ")" + (why ? ": " + why : "");
          return;
        }
        var reader = resp.body.getReader(), decoder = new TextDecoder(), first = true;
        for (;;) {
          var chunk = await reader.read();
          if (gen !== generation) { reader.cancel(); return; }
          if (first) { logs.textContent = ""; logs.dataset.rank = shownRank() || "all"; first = false; }
          if (chunk.done) break;
          var atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
          logs.textContent += decoder.decode(chunk.value, { stream: true });
          if (atBottom) logs.scrollTop = logs.scrollHeight;
        }
        if (!logs.textContent) logs.textContent = follow ? "(waiting for output…)" : "(no output)";
        if (!follow) logStatus.textContent = "complete";
      } catch (e) {
        if (gen !== generation) return;
        logStatus.textContent = "connection lost; retrying";
      }
      if (!follow) return;
      await sleep(1000);
    }
  }

  function showRank(rank) {
    generation += 1;
    if (controller) controller.abort();
    logs.textContent = "";
    delete logs.dataset.rank;
    logStatus.textContent = "loading…"; logStatus.className = "muted";
    followLogs(generation);
  }
  if (rankSel) {
    rankSel.addEventListener("change", function () { showRank(rankSel.value); });
    // the workers table's "rank K's log" links show that rank here (they open the plain
    // text without a script)
    document.querySelectorAll("a.rank-logs").forEach(function (a) {
      a.addEventListener("click", function (ev) {
        ev.preventDefault();
        rankSel.value = a.dataset.rank;
        showRank(rankSel.value);
        document.getElementById("logs-card").scrollIntoView({ block: "start" });
      });
    });
  }

  function renderWorkers(workers) {
    (workers || []).forEach(function (w) {
      var row = document.querySelector('#workers tr[data-rank="' + w.rank + '"]');
      if (!row) return;
      row.querySelector(".w-container").textContent = w.container || "—";
      row.querySelector(".w-node").textContent = w.node || "—";
      row.querySelector(".w-devices").textContent = (w.devices || []).join(", ") || "—";
    });
  }

  function renderTasks(tasks) {
    // a job array's tasks table: each task's state, exit code, restarts and message now
    (tasks || []).forEach(function (t) {
      var row = document.querySelector('#tasks tr[data-index="' + t.index + '"]');
      if (!row) return;
      var cell = row.querySelector(".t-state");
      cell.textContent = ""; cell.appendChild(badge(t.state));
      row.querySelector(".t-exit").textContent =
        t.exit_code === null || t.exit_code === undefined ? "" : String(t.exit_code);
      row.querySelector(".t-restarts").textContent = String(t.restarts || 0);
      row.querySelector(".t-message").textContent = t.message || "";
    });
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
        text("job-billed-gpu", String(job.billed_gpu_minutes));
        renderWorkers(job.workers);
        renderTasks(job.tasks);
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

  if (logs) followLogs(generation);  // an array has none: its tasks do
  pollJob();
})();
