// Dashboard charts (uPlot): live queue sizes by state and the daily processed/failed history.
(function () {
  "use strict";
  const STATES = ["active", "pending", "aggregating", "scheduled", "retry", "archived", "completed"];
  const COLORS = { active: "#1e88e5", pending: "#43a047", aggregating: "#8e24aa", scheduled: "#fb8c00", retry: "#f4511e", archived: "#757575", completed: "#00897b" };
  const MAX_POINTS = 360;
  const base = document.body.dataset.base || "";

  function width(el) { return Math.max(320, el.clientWidth - 8); }

  const sizeEl = document.getElementById("size-chart");
  const histEl = document.getElementById("history-chart");
  if (!sizeEl || !histEl || typeof uPlot === "undefined") return;

  const sizeData = [[]].concat(STATES.map(() => []));
  const sizePlot = new uPlot({
    width: width(sizeEl), height: 220,
    series: [{}].concat(STATES.map((s) => ({ label: s, stroke: COLORS[s], width: 2 }))),
    axes: [{}, { size: 60 }],
    // at least a five-minute window, so the first samples do not stretch the axis
    scales: { x: { time: true, range: () => {
      const hi = Date.now() / 1000;
      const first = sizeData[0].length ? sizeData[0][0] : hi;
      return [Math.min(first, hi - 300), hi + 1];
    } } },
  }, sizeData, sizeEl);

  function sample() {
    const now = Date.now() / 1000;
    sizeData[0].push(now);
    STATES.forEach((s, i) => {
      const el = document.querySelector('[data-total="' + s + '"]');
      sizeData[i + 1].push(el ? parseInt(el.textContent, 10) : 0);
    });
    if (sizeData[0].length > MAX_POINTS) sizeData.forEach((a) => a.shift());
    sizePlot.setData(sizeData);
  }
  sample();
  document.addEventListener("asyncq:refreshed", sample);

  // Throughput: the change of the all-time processed/failed counters between samples.
  const rateEl = document.getElementById("rate-chart");
  const rateData = [[], [], []];
  let last = null;
  const ratePlot = rateEl ? new uPlot({
    width: width(rateEl), height: 220,
    series: [{}, { label: "processed/s", stroke: "#3454d1", width: 2 }, { label: "failed/s", stroke: "#c62828", width: 2 }],
    axes: [{}, { size: 60 }],
    scales: { x: { time: true, range: () => {
      const hi = Date.now() / 1000;
      const first = rateData[0].length ? rateData[0][0] : hi;
      return [Math.min(first, hi - 300), hi + 1];
    } } },
  }, rateData, rateEl) : null;
  function sampleRate() {
    const el = document.querySelector("[data-processed-total]");
    if (!el || !ratePlot) return;
    const now = Date.now() / 1000;
    const cur = { t: now, p: parseInt(el.dataset.processedTotal, 10), f: parseInt(el.dataset.failedTotal, 10) };
    if (last !== null && cur.t > last.t) {
      const dt = cur.t - last.t;
      rateData[0].push(now);
      rateData[1].push(Math.max(0, (cur.p - last.p) / dt));
      rateData[2].push(Math.max(0, (cur.f - last.f) / dt));
      if (rateData[0].length > MAX_POINTS) rateData.forEach((a) => a.shift());
      ratePlot.setData(rateData);
    }
    last = cur;
  }
  sampleRate();
  document.addEventListener("asyncq:refreshed", sampleRate);

  let histPlot = null;
  async function loadHistory(days) {
    const resp = await fetch(base + "/api/stats?days=" + days, { credentials: "same-origin" });
    if (!resp.ok) return;
    const data = await resp.json();
    const xs = data.days.map((d) => Date.parse(d.date + "T00:00:00Z") / 1000);
    const series = [xs, data.days.map((d) => d.processed - d.failed), data.days.map((d) => d.failed)];
    if (histPlot) histPlot.destroy();
    histPlot = new uPlot({
      width: width(histEl), height: 220,
      series: [{}, { label: "succeeded", stroke: "#43a047", width: 2, points: { show: true } },
        { label: "failed", stroke: "#c62828", width: 2, points: { show: true } }],
      axes: [{}, { size: 60 }],
      scales: { x: { time: true } },
    }, series, histEl);
  }
  const range = document.getElementById("range");
  const savedDays = localStorage.getItem("asyncq.days") || "7";
  range.querySelectorAll("button").forEach((b) => {
    b.classList.toggle("on", b.dataset.days === savedDays);
    b.addEventListener("click", () => {
      range.querySelectorAll("button").forEach((x) => x.classList.remove("on"));
      b.classList.add("on");
      localStorage.setItem("asyncq.days", b.dataset.days);
      loadHistory(b.dataset.days);
    });
  });
  loadHistory(savedDays);
  window.addEventListener("resize", () => {
    sizePlot.setSize({ width: width(sizeEl), height: 220 });
    if (ratePlot) ratePlot.setSize({ width: width(rateEl), height: 220 });
    if (histPlot) histPlot.setSize({ width: width(histEl), height: 220 });
  });
})();
