// asyncq web UI: the durable run page's signal form, sent through the JSON API.
(function () {
  "use strict";
  document.addEventListener("submit", async (ev) => {
    const form = ev.target.closest("form#signal-form");
    if (!form) return;
    ev.preventDefault();
    const toast = document.getElementById("toast");
    const say = (message, isError) => {
      toast.textContent = message;
      toast.className = "toast" + (isError ? " err" : "");
      toast.hidden = false;
    };
    let payload;
    try {
      payload = JSON.parse(form.elements.payload.value || "null");
    } catch (err) {
      say("The payload is not JSON: " + err.message, true);
      return;
    }
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const res = await window.asyncqApi("POST", "queues/" + form.dataset.queuePath + "/signal", {
        name: form.elements.name.value,
        key: form.elements.key.value,
        payload,
      });
      say(res.message, false);
      await window.asyncqRefresh(true);
    } catch (err) {
      say(err.message, true);
    } finally {
      button.disabled = false;
    }
  });
})();
