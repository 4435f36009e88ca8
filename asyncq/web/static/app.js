// asyncq web UI: actions through the JSON API and live refresh by short polling.
(function () {
  "use strict";
  const body = document.body;
  const base = body.dataset.base || "";
  const defaultPoll = parseFloat(body.dataset.poll || "5");
  const banner = document.getElementById("banner");
  const toast = document.getElementById("toast");
  let timer = null;
  let toastTimer = null;

  function say(message, isError) {
    toast.textContent = message;
    toast.className = "toast" + (isError ? " err" : "");
    toast.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { toast.hidden = true; }, isError ? 8000 : 3500);
  }

  async function api(method, path, payload) {
    const opts = { method, headers: { "X-Asyncq-Request": "1", "Accept": "application/json" }, credentials: "same-origin" };
    if (payload !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(payload);
    }
    const resp = await fetch(base + "/api/" + path, opts);
    let data = {};
    try { data = await resp.json(); } catch (e) { data = {}; }
    if (!resp.ok) throw new Error((data.error && data.error.message) || resp.status + " " + resp.statusText);
    return data;
  }
  window.asyncqApi = api;

  function selected() {
    return Array.from(document.querySelectorAll("input.sel:checked")).map((el) => el.value);
  }

  function syncBatch() {
    const ids = selected();
    document.querySelectorAll(".batch").forEach((el) => {
      el.hidden = ids.length === 0;
      const n = el.querySelector(".nsel");
      if (n) n.textContent = String(ids.length);
    });
  }

  document.addEventListener("change", (ev) => {
    const t = ev.target;
    if (t.classList && t.classList.contains("selall")) {
      document.querySelectorAll("input.sel").forEach((el) => { el.checked = t.checked; });
    }
    if (t.classList && (t.classList.contains("sel") || t.classList.contains("selall"))) syncBatch();
  });

  document.addEventListener("click", async (ev) => {
    const btn = ev.target.closest("button[data-api], button[data-batch]");
    if (!btn) return;
    ev.preventDefault();
    if (btn.dataset.confirm && !window.confirm(btn.dataset.confirm)) return;
    btn.disabled = true;
    try {
      if (btn.dataset.batch) {
        const bar = btn.closest(".toolbar");
        const ids = selected();
        if (!window.confirm(btn.dataset.batch + " " + ids.length + " selected task(s)?")) return;
        const res = await api("POST", "queues/" + bar.dataset.queuePath + "/batch/" + btn.dataset.batch, { ids });
        const failed = Object.keys(res.errors || {}).length;
        say(btn.dataset.batch + ": " + res.done.length + " done" + (failed ? ", " + failed + " refused: " + Object.values(res.errors)[0] : ""), failed > 0);
      } else {
        const [method, path] = btn.dataset.api.split(" ");
        const res = await api(method, path);
        let msg = res.message || btn.textContent.trim() + (res.count !== undefined ? ": " + res.count + " task(s)" : ": done");
        if (res.skipped) msg += ", " + res.skipped + " skipped (moved or failed again since)";
        say(msg, res.deleted > 0);
        if (btn.dataset.after) { location.href = btn.dataset.after; return; }
      }
      await refresh(true);
    } catch (err) {
      say(err.message, true);
    } finally {
      btn.disabled = false;
    }
  });

  async function refresh(force) {
    if (!force && (selected().length > 0 || document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName) && document.activeElement.id !== "poll")) return;
    let resp;
    try {
      resp = await fetch(location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" });
    } catch (err) {
      banner.textContent = "The asyncq web server is unreachable; retrying.";
      banner.hidden = false;
      return;
    }
    const html = await resp.text();
    const doc = new DOMParser().parseFromString(html, "text/html");
    const fresh = doc.getElementById("live");
    if (resp.status === 503) {
      const msg = doc.querySelector(".error .message");
      banner.textContent = (msg ? msg.textContent : "Redis is unreachable") + " (retrying)";
      banner.hidden = false;
      return;
    }
    banner.hidden = true;
    if (!fresh) return;
    const live = document.getElementById("live");
    // Keep the parts a page marks static (charts) and swap the rest.
    const keep = live.querySelectorAll("[data-static]");
    const freshStatic = fresh.querySelectorAll("[data-static]");
    freshStatic.forEach((el, i) => { if (keep[i]) el.replaceWith(keep[i]); });
    live.replaceChildren(...fresh.childNodes);
    syncBatch();
    highlight(live);
    document.dispatchEvent(new CustomEvent("asyncq:refreshed"));
  }
  window.asyncqRefresh = refresh;

  function schedule(seconds) {
    clearInterval(timer);
    if (seconds > 0) timer = setInterval(() => refresh(false), seconds * 1000);
  }

  const poll = document.getElementById("poll");
  const saved = localStorage.getItem("asyncq.poll");
  const seconds = saved !== null ? parseFloat(saved) : defaultPoll;
  if (poll) {
    if (!Array.from(poll.options).some((o) => parseFloat(o.value) === seconds)) {
      poll.add(new Option(seconds + " s", String(seconds)));
    }
    poll.value = String(seconds);
    poll.addEventListener("change", () => {
      localStorage.setItem("asyncq.poll", poll.value);
      schedule(parseFloat(poll.value));
    });
  }
  schedule(seconds);
  // A browser runs a hidden tab's timers about once a minute: refresh as soon as the page
  // is seen again instead of at the next slow tick.
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && (poll ? parseFloat(poll.value) : seconds) > 0) refresh(false);
  });

  // JSON payloads and results, coloured by Prism's JSON grammar (vendor/prism). Prism
  // escapes the text it tokenises; bodies over 200 kB stay plain to keep pages responsive.
  const HIGHLIGHT_MAX = 200000;
  function highlight(root) {
    if (!window.Prism || !Prism.languages || !Prism.languages.json) return;
    root.querySelectorAll("pre.body.k-json, td.payload code.k-json, td.payload code:not([class])").forEach((el) => {
      if (el.dataset.hl) return;
      const text = el.textContent;
      const head = text.trimStart()[0];
      if ((head !== "{" && head !== "[") || text.length > HIGHLIGHT_MAX) return;
      el.innerHTML = Prism.highlight(text, Prism.languages.json, "json");
      el.dataset.hl = "1";
    });
  }
  highlight(document);
  window.asyncqHighlight = highlight;

  // Light/dark theme: the header's toggle flips it and remembers the choice.
  const themeBtn = document.getElementById("theme");
  function currentTheme() {
    const set = document.documentElement.dataset.theme;
    if (set) return set;
    return window.matchMedia && matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }
  if (themeBtn) {
    themeBtn.addEventListener("click", () => {
      const next = currentTheme() === "dark" ? "light" : "dark";
      document.documentElement.dataset.theme = next;
      try { localStorage.setItem("asyncq.theme", next); } catch (e) { /* not remembered */ }
      document.dispatchEvent(new CustomEvent("asyncq:theme"));
    });
  }

  // Sortable tables (client side, on the rows of the current page).
  document.addEventListener("click", (ev) => {
    const th = ev.target.closest("table.sortable th[data-sort]");
    if (!th) return;
    const table = th.closest("table");
    const idx = Array.from(th.parentNode.children).indexOf(th);
    const asc = th.dataset.dir !== "asc";
    th.dataset.dir = asc ? "asc" : "desc";
    const rows = Array.from(table.tBodies[0].rows);
    const key = (row) => {
      const cell = row.cells[idx];
      const v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent.trim();
      return th.dataset.sort === "num" ? parseFloat(v) : v.toLowerCase();
    };
    rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (asc ? 1 : -1));
    rows.forEach((r) => table.tBodies[0].appendChild(r));
  });
})();
