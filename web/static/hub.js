// The front page's figures, fetched again from /api/hub every few seconds while the page is visible. The live
// channel the dashboards use is per experiment; the hub's figures change slowly enough for a poll, which the
// server answers from what it built in the last seconds. Only numbers are written, as text.
(function () {
  "use strict";
  const totals = document.getElementById("hub-totals");
  if (!totals) return;
  const EVERY_MS = 4000;
  const rows = {};
  document.querySelectorAll("tr[data-slug]").forEach(function (tr) { rows[tr.dataset.slug] = tr; });

  function count(n) { return Number(n).toLocaleString("en-US"); }
  function rate(n) {
    return Number(n).toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
  }
  function duration(seconds) {  // as the template's macro
    const s = Math.round(seconds);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  function set(el, text) {
    if (el && el.textContent !== text) el.textContent = text;
  }

  function render(hub) {
    const t = hub.totals;
    set(document.getElementById("hub-online"), count(t.volunteers_online));
    set(document.getElementById("hub-volunteers"), count(t.volunteers));
    set(document.getElementById("hub-sps"), rate(t.samples_per_second));
    set(document.getElementById("hub-verified"), count(t.verified_samples));
    set(document.getElementById("hub-models"), count(t.models_trained));
    hub.experiments.forEach(function (e) {
      const tr = rows[e.slug];
      if (!tr) return;  // listed since the page loaded: it shows on the next load
      set(tr.querySelector(".fig-online"), count(e.volunteers_online));
      set(tr.querySelector(".fig-sps"), rate(e.samples_per_second));
      set(tr.querySelector(".fig-verified"), count(e.verified_samples));
      const bar = tr.querySelector("progress");
      bar.hidden = !e.total_steps;
      if (e.total_steps) { bar.max = e.total_steps; bar.value = e.step; }
      set(tr.querySelector(".fig-steps"), e.total_steps ? "step " + count(e.step) + " of " + count(e.total_steps) : "");
      set(tr.querySelector(".fig-eta"), e.eta_seconds === null ? "" : "about " + duration(e.eta_seconds) + " to go");
    });
    totals.dataset.generatedAt = hub.generated_at;
  }

  async function poll() {
    if (!document.hidden) {
      try {
        const response = await fetch("/api/hub", { headers: { Accept: "application/json" } });
        if (response.ok) render(await response.json());
      } catch (err) {
        // the server is restarting or the network is down: the next turn tries again
      }
    }
    setTimeout(poll, EVERY_MS);
  }
  setTimeout(poll, EVERY_MS);
})();
