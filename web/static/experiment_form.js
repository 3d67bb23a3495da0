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
