// The event tail: polls /api/events after the newest shown event, once a second,
// and puts new rows on top (while "follow" is ticked).
(function () {
  "use strict";
  const table = document.getElementById("events");
  if (!table) return;
  const base = document.body.dataset.base || "";
  const body = table.tBodies[0];
  const follow = document.getElementById("follow");
  let last = table.dataset.last || "";
  const MAX_ROWS = 500;
  const MAX_NOTES = 20;

  function cell(row, text, cls) {
    const td = row.insertCell();
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }

  function add(e) {
    const row = body.insertRow(0);
    row.className = "ev-" + e.kind;
    const time = new Date(e.time);
    const t = cell(row, time.toISOString().slice(11, 23));
    t.title = e.time;
    const badge = document.createElement("span");
    badge.className = "badge ev ev-" + e.kind;
    badge.textContent = e.kind;
    row.insertCell().appendChild(badge);
    cell(row, e.queue);
    cell(row, e.type);
    const idCell = row.insertCell();
    idCell.className = "id";
    const a = document.createElement("a");
    a.href = base + "/queues/" + encodeURIComponent(e.queue) + "/tasks/" + encodeURIComponent(e.task_id);
    a.textContent = e.task_id.slice(0, 8);
    a.title = e.task_id;
    idCell.appendChild(a);
    const detail = e.kind === "progress" ? Math.floor(e.fraction * 100) + "% " + e.message : e.error;
    const td = cell(row, detail, "err");
    if (e.workflow) {
      // A workflow step: a link to that workflow's events, before the detail.
      const wf = document.createElement("a");
      wf.className = "wf";
      wf.href = base + "/events?workflow=" + encodeURIComponent(e.workflow);
      wf.title = "this workflow's events: " + e.workflow;
      wf.textContent = "workflow " + e.workflow.slice(0, 8);
      td.insertBefore(document.createTextNode(" "), td.firstChild);
      td.insertBefore(wf, td.firstChild);
    }
    while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
  }

  // An entry of the stream that is not a readable event: named above the table.
  function skip(s) {
    const notes = document.getElementById("skipped-events");
    if (!notes) return;
    const p = document.createElement("p");
    p.className = "banner skipped";
    p.textContent = "event " + s.id + " skipped: field '" + s.field + "' " + s.problem;
    notes.appendChild(p);
    while (notes.children.length > MAX_NOTES) notes.removeChild(notes.firstChild);
  }

  async function poll() {
    if (follow && !follow.checked) return;
    const params = new URLSearchParams();
    if (last) params.set("after", last);
    for (const name of ["queue", "type", "kind", "workflow", "task", "progress"]) {
      if (table.dataset[name]) params.set(name, table.dataset[name]);
    }
    try {
      const resp = await fetch(base + "/api/events?" + params, { credentials: "same-origin" });
      if (!resp.ok) return;
      const data = await resp.json();
      for (const e of data.events) add(e);
      // Past the skipped entries too, so that each is named once.
      if (data.last) last = data.last;
      for (const s of data.skipped || []) skip(s);
      if (data.events.length) {
        const empty = document.getElementById("no-events");
        if (empty) empty.remove();
      }
    } catch (err) {
      // Offline or the server restarting: the next tick tries again.
    }
  }

  setInterval(poll, 1000);
})();
