// A volunteer's page: their verified samples over time, drawn with uPlot (as the dashboard's charts) from the
// profile's JSON (/api/users/NAME).
(function () {
  "use strict";
  const root = document.getElementById("profile");
  const el = document.getElementById("chart-history");
  if (!root || !el) return;

  function draw(points) {
    el.dataset.points = String(points.length);
    if (typeof uPlot === "undefined") {
      el.textContent = "Charts need uPlot: run `make setup` on the server.";
      return;
    }
    const data = [points.map(function (p) { return p.t; }), points.map(function (p) { return p.verified_samples; })];
    const opts = {
      width: Math.max(300, el.clientWidth || 600), height: 220,
      series: [{}, { label: "verified samples", stroke: "#16a34a", width: 2 }],
      axes: [{}, {}],
    };
    const chart = new uPlot(opts, data, el);
    window.addEventListener("resize", function () {
      chart.setSize({ width: Math.max(300, el.clientWidth), height: 220 });
    });
  }

  window.addEventListener("load", function () {
    fetch("/api/users/" + encodeURIComponent(root.dataset.username))
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (profile) { draw(profile.history); })
      .catch(function () { el.textContent = "The chart could not be loaded."; });
  });
})();
