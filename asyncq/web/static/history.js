// Metrics page charts (uPlot): all task types' runs per step, then per task type its runs
// and failures and its p50/p95/p99 run times. The data is the JSON the page carries
// (#history-data); each refresh brings a new page whose JSON replaces the charts' data.
(function () {
  "use strict";
  const host = document.getElementById("history-charts");
  const form = document.querySelector("form.filters");
  if (form) {
    const select = form.querySelector("select[name=queue]");
    if (select) select.addEventListener("change", () => form.submit());
  }
  if (!host || typeof uPlot === "undefined") return;
  const HEIGHT = 190;

  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function width(el) { return Math.max(220, el.clientWidth - 4); }
  const pad = (n) => String(n).padStart(2, "0");
  function clock(u, splits) {
    return splits.map((t) => { const d = new Date(t * 1000); return pad(d.getHours()) + ":" + pad(d.getMinutes()); });
  }
  function axes(size) {
    const stroke = css("--muted"), grid = { stroke: css("--line"), width: 1 };
    return [{ stroke, grid, ticks: grid, values: clock }, { stroke, grid, ticks: grid, size: size || 50 }];
  }
  // Legends show the newest step that has a value, unless the cursor is over the chart.
  function lastIdx(u) {
    for (let i = u.data[0].length - 1; i >= 0; i--) if (u.data[1][i] != null) return i;
    return u.data[0].length ? u.data[0].length - 1 : null;
  }
  function latest(u) { const i = lastIdx(u); if (i != null && u.cursor.idx == null) u.setLegend({ idx: i }); }
  const hooks = { setCursor: [(u) => { if (u.cursor.idx == null) latest(u); }] };
  const num = (u, v) => (v == null ? "–" : v < 10 ? (Math.round(v * 100) / 100).toLocaleString() : Math.round(v).toLocaleString());
  const ms = (u, v) => (v == null ? "–" : v < 10 ? v.toFixed(1) + " ms" : Math.round(v).toLocaleString() + " ms");
  const msAxis = (u, splits) => splits.map((v) => (v >= 1000 ? (v / 1000).toFixed(v % 1000 ? 1 : 0) + "s" : v + "ms"));

  let data = null;
  const plots = [];

  // The charts end with the last step that is over: the current one, still filling (and
  // flushed by the workers every few seconds), would draw a drop that did not happen. The
  // table below counts it.
  function read() {
    const el = document.getElementById("history-data");
    if (!el) return null;
    let d;
    try { d = JSON.parse(el.dataset.history); } catch (e) { return null; }
    const n = d.t.length;
    if (n > 1 && d.t[n - 1] + d.step > d.now) {
      d.t = d.t.slice(0, -1);
      ["processed", "failed"].forEach((k) => { d.total[k] = d.total[k].slice(0, -1); });
      d.types.forEach((m) => {
        if (m.series) Object.keys(m.series).forEach((k) => { m.series[k] = m.series[k].slice(0, -1); });
      });
    }
    return d;
  }

  function xs(d) {
    const offset = Date.now() / 1000 - d.now; // server clock -> this browser's
    return d.t.map((t) => t + offset);
  }
  const pts = { size: 6, filter: window.asyncqLonePoints }; // live.js
  const perMin = (d, arr) => arr.map((n) => n * 60 / d.step);
  const toMs = (arr) => arr.map((v) => (v == null ? null : v * 1000));

  function runsPlot(el, d, processed, failed) {
    return new uPlot({
      width: width(el), height: HEIGHT, hooks,
      series: [{}, { label: "processed/min", stroke: css("--accent"), width: 2, value: num, points: pts },
        { label: "failed/min", stroke: css("--danger"), width: 2, value: num, points: pts }],
      axes: axes(), scales: { x: { time: true } },
    }, [xs(d), perMin(d, processed), perMin(d, failed)], el);
  }
  function latencyPlot(el, d, s) {
    return new uPlot({
      width: width(el), height: HEIGHT, hooks,
      series: [{}, { label: "p50", stroke: css("--pending"), width: 2, value: ms, spanGaps: true, points: pts },
        { label: "p95", stroke: css("--scheduled"), width: 2, value: ms, spanGaps: true, points: pts },
        { label: "p99", stroke: css("--danger"), width: 2, value: ms, spanGaps: true, points: pts }],
      axes: (() => { const a = axes(58); a[1].values = msAxis; return a; })(),
      scales: { x: { time: true } },
    }, [xs(d), toMs(s.p50), toMs(s.p95), toMs(s.p99)], el);
  }

  function card(title, sub) {
    const sec = document.createElement("section");
    sec.className = "card chart tchart";
    const h = document.createElement("h2");
    h.textContent = title;
    const small = document.createElement("small");
    small.textContent = sub;
    h.appendChild(small);
    sec.appendChild(h);
    host.appendChild(sec);
    return sec;
  }
  const fmtS = (v) => (v == null ? "–" : v < 1 ? (v * 1000).toFixed(v < 0.01 ? 1 : 0) + " ms" : v.toFixed(2) + " s");

  function build() {
    plots.splice(0).forEach((p) => p.destroy());
    host.replaceChildren();
    if (!data || !data.types.length) return;
    const all = card("All task types", "runs per minute, every " + data.step / 60 + " min");
    const allEl = document.createElement("div");
    all.appendChild(allEl);
    plots.push(runsPlot(allEl, data, data.total.processed, data.total.failed));
    data.types.filter((m) => m.series).forEach((m) => {
      const sec = card(m.task_type, m.queue + " · " + m.processed.toLocaleString() + " runs, " +
        m.failed.toLocaleString() + " failed · p95 " + fmtS(m.p95));
      const pair = document.createElement("div");
      pair.className = "pair";
      const a = document.createElement("div"), b = document.createElement("div");
      a.setAttribute("aria-label", m.task_type + " throughput");
      b.setAttribute("aria-label", m.task_type + " run time");
      pair.append(a, b);
      sec.appendChild(pair);
      plots.push(runsPlot(a, data, m.series.processed, m.series.failed));
      plots.push(latencyPlot(b, data, m.series));
    });
    plots.forEach(latest);
  }

  data = read();
  build();
  document.addEventListener("asyncq:refreshed", () => { data = read(); build(); });
  document.addEventListener("asyncq:theme", build);
  window.addEventListener("resize", () => plots.forEach((p) => p.setSize({ width: width(p.root.parentNode), height: HEIGHT })));
})();
