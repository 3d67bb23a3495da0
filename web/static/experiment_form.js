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
  ["input", "change"].forEach(function (kind) {
    batch.addEventListener(kind, sync);
    matchmaking.addEventListener(kind, sync);
  });
  sync();
})();

// The task's proposed target batch size and timings (GET /api/tasks/{task}/proposal), and its optimizer and learning
// rate where the task proposes them (ALBERT: LAMB at a rate measured for the batch), for the task, its parameters
// and the peers planned. A new experiment takes the proposal until the organizer types their own values; the
// "Use the proposal" button takes it any time. A warning says when the settings cap the swarm below one peer.
(function () {
  const box = document.getElementById("proposal");
  const form = document.getElementById("experiment-form");
  const select = document.getElementById("task-select");
  if (!box || !form || !select) return;
  const peers = document.getElementById("planned-peers");
  const text = document.getElementById("proposal-text");
  const use = document.getElementById("use-proposal");
  const warning = document.getElementById("rate-cap-warning");
  const fastest = parseFloat(box.dataset.fastest) || 0;
  const names = ["target_batch_size", "matchmaking_time", "averaging_timeout"];
  const inputs = names.map(function (n) { return form.querySelector("input[name=" + n + "]"); });
  const optimizer = form.querySelector("select[name=optimizer]");
  const rate = form.querySelector("input[name=learning_rate]");
  let follow = box.dataset.proposed === "true";  // a new form follows the proposal until a field is typed in
  let current = null, asked = 0;
  const number = function (x, digits) { return x.toLocaleString("en-US", {maximumFractionDigits: digits || 0}); };

  function warn() {
    const cap = parseFloat(inputs[0].value) / parseFloat(inputs[1].value);
    const found = [];
    if (current && cap < current.reference_samples_per_second) {
      found.push("These settings cap the whole swarm at " + number(cap) + " samples/s, below the " +
        number(current.reference_samples_per_second) + " samples/s that one reference peer trains on this task: " +
        "the swarm would wait instead of training.");
    }
    if (fastest > cap) {
      found.push("These settings cap the whole swarm at " + number(cap) + " samples/s, below the " + number(fastest) +
        " samples/s one peer of this experiment alone has trained.");
    }
    warning.textContent = found.join(" ");
    warning.hidden = found.length === 0;
  }

  function apply() {
    names.forEach(function (n, k) {
      inputs[k].value = current[n];
      inputs[k].dispatchEvent(new Event("change"));  // the rate cap follows; "change" is not typing
    });
    if (current.optimizer && optimizer) optimizer.value = current.optimizer;
    if (current.learning_rate != null && rate) rate.value = current.learning_rate;
    warn();
  }

  async function refresh() {
    const mine = ++asked;
    const query = new URLSearchParams();
    document.querySelectorAll(".task-params[data-task='" + select.value + "'] [name]").forEach(function (input) {
      if (input.disabled || input.value === "" || (input.type === "checkbox" && !input.checked)) return;
      query.set(input.name.slice(("param." + select.value + ".").length), input.value);
    });
    if (peers.value) query.set("planned_peers", peers.value);
    let answer = null;
    try {
      const response = await fetch("/api/tasks/" + encodeURIComponent(select.value) + "/proposal?" + query);
      answer = response.ok ? await response.json() : null;
    } catch (e) { answer = null; }
    if (mine !== asked) return;  // a later question is on its way
    current = answer;
    use.hidden = !current;
    text.textContent = current
      ? "The task proposes a target batch size of " + number(current.target_batch_size) + ", matchmaking time " +
        number(current.matchmaking_time, 2) + " s and averaging timeout " + number(current.averaging_timeout, 2) +
        " s for " + number(current.planned_peers) + " peers at " + number(current.reference_samples_per_second) +
        " samples/s each (its reference peer): they keep " + number(current.unthrottled_peers, 1) +
        " such peers bound by compute." +
        (current.optimizer && current.learning_rate != null
          ? " Optimizer: " + current.optimizer + " at a learning rate of " + current.learning_rate + "."
          : "")
      : "No proposal for these parameters: check the task's fields.";
    if (current && follow) apply(); else warn();
  }

  inputs.concat([rate]).forEach(function (input) {
    if (input) input.addEventListener("input", function () { follow = false; warn(); });
  });
  if (optimizer) optimizer.addEventListener("change", function () { follow = false; });
  use.addEventListener("click", function () { if (current) apply(); });
  select.addEventListener("change", refresh);
  peers.addEventListener("input", refresh);
  form.querySelectorAll(".task-params [name]").forEach(function (input) {
    input.addEventListener("input", refresh);
    input.addEventListener("change", refresh);
  });
  refresh();
})();
