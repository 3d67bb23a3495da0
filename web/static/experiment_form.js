// Show only the selected task's parameters; the hidden ones are disabled so they are not submitted.
(function () {
  const select = document.getElementById("task-select");
  if (!select) return;
  function sync() {
    document.querySelectorAll(".task-params").forEach(function (box) {
      const active = box.dataset.task === select.value;
      box.hidden = !active;
      box.querySelectorAll("input, select").forEach(function (input) { input.disabled = !active; });
    });
  }
  select.addEventListener("change", sync);
  sync();
})();

// The swarm's rate cap (target batch size / matchmaking time), kept up to date as either field changes.
(function () {
  const out = document.getElementById("rate-cap-value");
  const batch = document.querySelector("input[name=target_batch_size]");
  const matchmaking = document.querySelector("input[name=matchmaking_time]");
  if (!out || !batch || !matchmaking) return;
  function sync() {
    const b = parseFloat(batch.value), m = parseFloat(matchmaking.value);
    out.textContent = b > 0 && m > 0 ? Math.round(b / m).toLocaleString("en-US") : "?";
  }
  batch.addEventListener("input", sync);
  matchmaking.addEventListener("input", sync);
  sync();
})();
