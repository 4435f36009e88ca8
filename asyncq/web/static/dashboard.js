// Dashboard charts (uPlot): live queue sizes by state, live throughput (its past hour from
// the workers' metrics history, per minute; the live samples are live.js's) and the daily
// processed/failed history. Colours come from the CSS variables the state badges use, so
// a state has one colour everywhere and the charts follow the light/dark theme.
(function () {
  "use strict";
  const STATES = ["active", "pending", "aggregating", "scheduled", "retry", "archived", "completed"];
  const MAX_POINTS = 360;
  const HEIGHT = 220;
  const base = document.body.dataset.base || "";

  const sizeEl = document.getElementById("size-chart");
  const rateEl = document.getElementById("rate-chart");
  const histEl = document.getElementById("history-chart");
  if (!sizeEl || !histEl || typeof uPlot === "undefined" || !window.AsyncqLiveSeries) return; // live.js

  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function width(el) { return Math.max(240, el.clientWidth - 4); }
  const pad = (n) => String(n).padStart(2, "0");
  // Clock times (HH:MM, with seconds when ticks are closer than a minute) for live charts.
  function clock(u, splits, ax, space, incr) {
    return splits.map((t) => {
      const d = new Date(t * 1000);
      return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (incr < 60 ? ":" + pad(d.getSeconds()) : "");
    });
  }
  function axes(live) {
    const stroke = css("--muted"), grid = { stroke: css("--line"), width: 1 };
    const x = { stroke, grid, ticks: grid };
    if (live) x.values = clock;
    return [x, { stroke, grid, ticks: grid, size: 56 }];
  }
  // Legends show the newest values whenever the cursor is not over the chart.
  function lastIdx(u) { return u.data[0].length ? u.data[0].length - 1 : null; }
  const showLatest = { setCursor: [(u) => { if (u.cursor.idx == null && lastIdx(u) != null) u.setLegend({ idx: lastIdx(u) }); }] };
  function latest(u) { if (lastIdx(u) != null && u.cursor.idx == null) u.setLegend({ idx: lastIdx(u) }); }
  function liveRange(data) {
    return () => {
      const hi = Date.now() / 1000;
      const first = data[0].length ? data[0][0] : hi;
      return [Math.min(first, hi - 120), hi + 1];
    };
  }
  const int = (u, v) => (v == null ? "--" : Math.round(v).toLocaleString());
  const rate = (u, v) => (v == null ? "--" : v < 10 ? v.toFixed(2) : Math.round(v).toLocaleString());
  const pts = { size: 5, filter: window.asyncqLonePoints }; // one sample after a gap: a dot

  // -- data, kept across theme changes (the plots are rebuilt, the samples stay) --
  // Samples come from the page: the server records one at each dashboard render (anyone's)
  // and sends the last 30 minutes, so a new page starts with what the process has seen.
  const live = new window.AsyncqLiveSeries(STATES, Math.max(150, 3 * parseFloat(document.body.dataset.poll || "5")), MAX_POINTS);
  const sizeData = live.sizes;
  const liveRate = live.rates; // between two samples of this page or of the web process
  const rateData = [[], [], []];
  let minuteRate = [[], [], []]; // per minute, from the metrics history (/api/history)
  let histData = null;
  let sizePlot = null, ratePlot = null, histPlot = null;

  function build() {
    if (sizePlot) sizePlot.destroy();
    sizePlot = new uPlot({
      width: width(sizeEl), height: HEIGHT, hooks: showLatest,
      series: [{}].concat(STATES.map((s) => ({ label: s, stroke: css("--" + s), width: 2, value: int, points: pts }))),
      axes: axes(true),
      scales: { x: { time: true, range: liveRange(sizeData) } },
    }, sizeData, sizeEl);
    latest(sizePlot);
    if (rateEl) {
      if (ratePlot) ratePlot.destroy();
      ratePlot = new uPlot({
        width: width(rateEl), height: HEIGHT, hooks: showLatest,
        series: [{}, { label: "processed/s", stroke: css("--accent"), width: 2, value: rate, points: pts },
          { label: "failed/s", stroke: css("--danger"), width: 2, value: rate, points: pts }],
        axes: axes(true),
        scales: { x: { time: true, range: liveRange(rateData) } },
      }, rateData, rateEl);
      drawRates();
    }
    if (histData) drawHistory();
  }

  function sample() {
    const el = document.getElementById("live-samples");
    if (!el) return;
    let got;
    try { got = JSON.parse(el.dataset.live); } catch (e) { return; }
    if (!live.add(got.samples, got.now, Date.now() / 1000)) return;
    sizePlot.setData(sizeData);
    latest(sizePlot);
    drawRates();
  }

  // The throughput chart: the history's minutes before the first live rate, then the live
  // rates, so a first view (even of a web process that just started) shows the past hour.
  function drawRates() {
    const firstLive = liveRate[0].length ? liveRate[0][0] : Infinity;
    rateData.forEach((a) => { a.length = 0; });
    minuteRate[0].forEach((t, i) => {
      if (t < firstLive) { rateData[0].push(t); rateData[1].push(minuteRate[1][i]); rateData[2].push(minuteRate[2][i]); }
    });
    liveRate.forEach((a, j) => { rateData[j].push(...a); });
    if (ratePlot) { ratePlot.setData(rateData); latest(ratePlot); }
  }
  let minutesAt = 0;
  async function loadMinutes() {
    if (!rateEl || Date.now() - minutesAt < 30000) return;
    minutesAt = Date.now();
    let resp;
    try { resp = await fetch(base + "/api/history?window=60", { credentials: "same-origin" }); } catch (e) { return; }
    if (!resp.ok) return;
    const h = await resp.json();
    const offset = Date.now() / 1000 - h.now;
    const fresh = [[], [], []];
    h.t.forEach((t, i) => {
      if (t + h.step > h.now) return; // the current minute is not over: its rate would be low
      fresh[0].push(t + h.step + offset); // a minute's rate belongs to its end
      fresh[1].push(h.total.processed[i] / h.step);
      fresh[2].push(h.total.failed[i] / h.step);
    });
    // the minutes before the first run are no news: start at the first minute with runs
    const first = fresh[1].findIndex((v, i) => v > 0 || fresh[2][i] > 0);
    minuteRate = first < 0 ? [[], [], []] : fresh.map((a) => a.slice(first));
    drawRates();
  }

  function drawHistory() {
    if (histPlot) histPlot.destroy();
    histPlot = new uPlot({
      width: width(histEl), height: HEIGHT, hooks: showLatest,
      series: [{}, { label: "succeeded", stroke: css("--pending"), width: 2, value: int, points: { show: true, size: 6 } },
        { label: "failed", stroke: css("--danger"), width: 2, value: int, points: { show: true, size: 6 } }],
      axes: axes(false),
      scales: { x: { time: true } },
    }, histData, histEl);
    latest(histPlot);
  }

  let days = localStorage.getItem("asyncq.days") || "7";
  async function loadHistory() {
    const resp = await fetch(base + "/api/stats?days=" + days, { credentials: "same-origin" });
    if (!resp.ok) return;
    const data = await resp.json();
    const xs = data.days.map((d) => Date.parse(d.date + "T00:00:00Z") / 1000);
    const fresh = [xs, data.days.map((d) => d.processed - d.failed), data.days.map((d) => d.failed)];
    const sameDays = histData && histData[0].length === xs.length && histData[0][0] === xs[0];
    histData = fresh;
    if (histPlot && sameDays) {
      histPlot.setData(histData);
      latest(histPlot);
    } else {
      drawHistory();
    }
  }

  build();
  sample();
  loadHistory();
  loadMinutes();
  document.addEventListener("asyncq:refreshed", () => {
    sample();
    loadHistory(); // today's counters move; one small request per refresh
    loadMinutes(); // at most every 30 s: the history moves by the minute
  });
  // A second sample soon after load when this process had none before, so even the very
  // first view shows a throughput instead of waiting a whole refresh interval.
  if (liveRate[0].length === 0 && window.asyncqRefresh) setTimeout(() => window.asyncqRefresh(true), 1500);

  const range = document.getElementById("range");
  range.querySelectorAll("button").forEach((b) => {
    b.classList.toggle("on", b.dataset.days === days);
    b.addEventListener("click", () => {
      range.querySelectorAll("button").forEach((x) => x.classList.remove("on"));
      b.classList.add("on");
      days = b.dataset.days;
      localStorage.setItem("asyncq.days", days);
      loadHistory();
    });
  });
  document.addEventListener("asyncq:theme", build);
  window.addEventListener("resize", () => {
    sizePlot.setSize({ width: width(sizeEl), height: HEIGHT });
    if (ratePlot) ratePlot.setSize({ width: width(rateEl), height: HEIGHT });
    if (histPlot) histPlot.setSize({ width: width(histEl), height: HEIGHT });
  });
})();
