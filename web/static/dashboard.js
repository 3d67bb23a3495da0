// Live dashboard: a snapshot over the websocket on connect and on every change; polling the JSON API
// while the socket is down. Charts are uPlot (installed from npm at set-up).
(function () {
  "use strict";
  const root = document.getElementById("dashboard");
  if (!root) return;
  const slug = root.dataset.slug;
  const charts = {};

  function fmt(n, digits) {
    if (n === null || n === undefined) return "–";
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
  }

  function ago(iso) {
    if (!iso) return "never";
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }

  // reference: null or {label, value}, drawn as a dashed line across the chart (a baseline to beat)
  function drawChart(id, label, color, xs, ys, reference) {
    const el = document.getElementById(id);
    el.dataset.points = String(xs.length);
    el.dataset.reference = reference ? String(reference.value) : "";
    if (typeof uPlot === "undefined") {
      el.textContent = "Charts need uPlot: run `make setup` on the server.";
      return;
    }
    const data = [xs, ys];
    if (reference) data.push(xs.map(function () { return reference.value; }));
    if (charts[id] && charts[id].series.length !== data.length) { charts[id].destroy(); delete charts[id]; }
    if (!charts[id]) {
      const series = [{}, { label: label, stroke: color, width: 2 }];
      if (reference) series.push({ label: reference.label, stroke: "#7f8c8d", width: 1.5, dash: [6, 4] });
      const opts = {
        width: Math.max(300, el.clientWidth || 600), height: 220,
        series: series,
        axes: [{}, {}],
      };
      charts[id] = new uPlot(opts, data, el);
      window.addEventListener("resize", function () {
        if (charts[id]) charts[id].setSize({ width: Math.max(300, el.clientWidth), height: 220 });
      });
    } else {
      charts[id].setData(data);
    }
  }

  function duration(seconds) {
    const s = Math.round(seconds || 0);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }

  // short labels of the milestone keys leaderboard rows carry (server/ledger/milestones.py)
  const MILESTONE_LABELS = { first_round: "1st round", samples_1m: "1M", samples_10m: "10M", samples_100m: "100M",
    online_24h: "24 h", checkpoint: "checkpoint" };

  function renderLeaderboard(rows) {
    const body = document.querySelector("#leaderboard tbody");
    body.replaceChildren();
    if (!rows.length) {
      const tr = document.createElement("tr");
      tr.className = "empty";
      const td = document.createElement("td");
      td.colSpan = 8; td.textContent = "No contributions yet.";
      tr.appendChild(td); body.appendChild(tr);
      return;
    }
    rows.forEach(function (r) {
      const tr = document.createElement("tr");
      if (r.active) tr.className = "active";
      tr.dataset.username = r.username;
      const pending = r.pending_samples ? " (+" + fmt(r.pending_samples, 0) + " pending)" : "";
      [r.rank, r.username, fmt(r.samples, 0) + pending, fmt(100 * r.share, 1) + " %", fmt(r.claimed_samples, 0),
        fmt(r.samples_per_second, 1), duration(r.time_online_seconds), r.active ? "now" : ago(r.last_seen)]
        .forEach(function (v) { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
      if (r.profile_url) {  // null when the volunteer hid their profile: the name stays, without a link
        const link = document.createElement("a");
        link.href = r.profile_url; link.textContent = r.username;
        tr.children[1].replaceChildren(link);
      }
      (r.milestones || []).forEach(function (key) {  // text only: a key is data
        const badge = document.createElement("span");
        badge.className = "badge badge-small"; badge.dataset.key = key;
        badge.textContent = MILESTONE_LABELS[key] || key;
        tr.children[1].append(" ", badge);
      });
      body.appendChild(tr);
    });
  }

  // Organizers also see the claims that the swarm's signed records do not back (the API adds them for them).
  const flagsList = document.getElementById("flags");
  async function refreshFlags() {
    try {
      const rows = await fetch("/api/experiments/" + slug + "/leaderboard").then(function (r) { return r.json(); });
      flagsList.replaceChildren();
      rows.forEach(function (r) {
        (r.flags || []).forEach(function (text) {
          const li = document.createElement("li");
          const who = document.createElement("strong");
          who.textContent = r.username;
          li.appendChild(who); li.appendChild(document.createTextNode(": " + text));
          flagsList.appendChild(li);
        });
      });
      if (!flagsList.children.length) {
        const li = document.createElement("li");
        li.className = "muted"; li.textContent = "Nothing implausible so far.";
        flagsList.appendChild(li);
      }
    } catch (e) { /* offline: try again on the next tick */ }
  }

  // Organizers see the server's own peers (monitor, witness, checkpoints) change state without reloading.
  const serverPeers = document.getElementById("server-peers");
  function hhmmss(iso) { return iso ? iso.slice(11, 19) + " UTC" : ""; }
  async function refreshServerPeers() {
    try {
      const view = await fetch("/api/experiments/" + slug + "/swarm").then(function (r) { return r.json(); });
      const body = serverPeers.querySelector("tbody");
      body.replaceChildren();
      (view.server_peers || []).forEach(function (p) {
        const tr = document.createElement("tr");
        tr.dataset.kind = p.kind;
        let state = p.state;
        if (p.state === "running" && !p.in_swarm) state += " (joining)";
        if (p.next_attempt_at) state += ", next try " + hhmmss(p.next_attempt_at);
        [p.kind + (p.index ? " " + (p.index + 1) : ""), state, hhmmss(p.since), String(p.restarts), p.last_error || "—"].forEach(function (text, i) {
          const td = document.createElement("td");
          td.textContent = text;
          if (i === 1) td.className = "state" + (p.state !== "running" ? " warn" : "");
          if (i === 3) td.className = "restarts";
          if (i === 4) td.className = "error";
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      if (!body.children.length) {
        const tr = document.createElement("tr"), td = document.createElement("td");
        tr.className = "empty"; td.colSpan = 5; td.textContent = "The server runs no peer for this experiment now.";
        tr.appendChild(td); body.appendChild(tr);
      }
    } catch (e) { /* offline: try again on the next tick */ }
  }

  function render(snapshot) {
    const m = snapshot.metrics, s = m.summary;
    document.getElementById("stat-loss").textContent = fmt(s.loss, 4);
    document.getElementById("stat-sps").textContent = fmt(s.samples_per_second, 1);
    document.getElementById("stat-peers").textContent = fmt(s.active_peers, 0);
    document.getElementById("stat-samples").textContent = fmt(s.verified_samples, 0);
    document.getElementById("stat-claimed").textContent = fmt(s.total_samples, 0);
    document.getElementById("stat-epoch").textContent = fmt(s.epoch, 0);
    const status = document.getElementById("status");
    status.textContent = s.status; status.className = "status status-" + s.status;
    baseline = m.baseline || null;
    const onTraining = baseline && (baseline.measured_on === "training" || !evalBox);
    renderBaseline(onTraining ? "loss-baseline" : "eval-baseline");
    const xs = m.series.map(function (p) { return p.t; });
    drawChart("chart-loss", "loss", "#c0392b", xs, m.series.map(function (p) { return p.loss; }),
      onTraining ? reference() : null);
    drawChart("chart-sps", "samples/s", "#2471a3", xs, m.series.map(function (p) { return p.samples_per_second; }));
    renderLeaderboard(snapshot.leaderboard);
    if (snapshot.checkpoints) renderCheckpoints(snapshot.checkpoints);
  }

  function percent(share) {
    return share === null || share === undefined ? "–" : fmt(100 * share, 1) + " %";
  }

  // The baseline (GET /api/experiments/{slug}/metrics, "baseline"): what a model that knows only how often each
  // label occurs scores, as a dashed line on the chart its loss compares with and as words under it.
  let baseline = null;
  function reference() {
    return baseline ? { label: "baseline: " + baseline.label, value: baseline.loss } : null;
  }
  function renderBaseline(id) {
    const el = document.getElementById(id);
    if (!el) return;
    el.hidden = !baseline;
    if (!baseline) return;
    el.querySelector(".baseline-label").textContent = baseline.label;
    el.querySelector(".baseline-loss").textContent = fmt(baseline.loss, 3);
    el.querySelector(".baseline-top1").textContent = percent(baseline.top1);
    el.querySelector(".baseline-top5").textContent = percent(baseline.top5);
  }

  // The server's checkpoints: held-out loss and accuracy over time, and the newest model to download.
  const evalBox = document.getElementById("checkpoints");
  function renderCheckpoints(rows) {
    if (!evalBox) return;
    const scored = rows.filter(function (c) { return c.eval_loss !== null; });
    const onHeldOut = baseline && baseline.measured_on === "held-out";
    drawChart("chart-eval", "held-out loss", "#7d3c98",
      scored.map(function (c) { return Date.parse(c.created_at) / 1000; }),
      scored.map(function (c) { return c.eval_loss; }), onHeldOut ? reference() : null);
    const ranked = rows.filter(function (c) { return c.eval_top1 !== null; });
    drawChart("chart-accuracy", "top-1", "#1e8449",
      ranked.map(function (c) { return Date.parse(c.created_at) / 1000; }),
      ranked.map(function (c) { return c.eval_top1; }),
      onHeldOut && baseline.top1 !== null ? { label: "baseline: " + baseline.label, value: baseline.top1 } : null);
    const newest = scored.length ? scored[scored.length - 1] : null;
    document.getElementById("eval-stat-loss").textContent = newest ? fmt(newest.eval_loss, 3) : "–";
    document.getElementById("eval-stat-top1").textContent = newest ? percent(newest.eval_top1) : "–";
    document.getElementById("eval-stat-top5").textContent = newest ? percent(newest.eval_top5) : "–";
    const kept = rows.filter(function (c) { return c.downloadable; });
    const latest = kept.length ? kept[kept.length - 1] : null;
    document.getElementById("model-download").hidden = !latest;
    document.getElementById("no-checkpoint").hidden = !!latest;
    if (latest) {
      document.getElementById("model-step").textContent = "(collaborative step " + latest.epoch +
        (latest.eval_loss !== null ? ", held-out loss " + fmt(latest.eval_loss, 4) : "") + ")";
    }
  }

  let pollTimer = null;
  async function poll() {
    try {
      const [metrics, leaderboard] = await Promise.all([
        fetch("/api/experiments/" + slug + "/metrics").then(function (r) { return r.json(); }),
        fetch("/api/experiments/" + slug + "/leaderboard").then(function (r) { return r.json(); }),
      ]);
      const checkpoints = evalBox
        ? await fetch("/api/experiments/" + slug + "/checkpoints").then(function (r) { return r.json(); })
        : null;
      render({ metrics: metrics, leaderboard: leaderboard, checkpoints: checkpoints });
    } catch (e) { /* offline: try again on the next tick */ }
  }

  let backoff = 1000;
  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(proto + "//" + location.host + "/ws/experiments/" + slug + "/live");
    const state = document.getElementById("live-state");
    ws.onopen = function () {
      backoff = 1000; state.textContent = "live";
      if (pollTimer) { clearInterval(pollTimer); pollTimer = null; }
    };
    ws.onmessage = function (event) {
      try { render(JSON.parse(event.data)); } catch (e) { console.error(e); }
    };
    ws.onclose = function () {
      state.textContent = "reconnecting…";
      if (!pollTimer) pollTimer = setInterval(poll, 5000);
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
  }

  window.addEventListener("load", function () {
    poll(); connect();
    if (flagsList) { refreshFlags(); setInterval(refreshFlags, 10000); }
    if (serverPeers) { setInterval(refreshServerPeers, 5000); }
  });
})();
