// Shared by the chart pages: the points of lone values (asyncqLonePoints), and the
// dashboard's live samples (AsyncqLiveSeries).
//
// A value with no value beside it (a type with one minute of runs, one sample after a
// gap) has no line to draw, and uPlot hides points where they are dense, so such a value
// would not show at all while the legend reads it: its point is drawn.
//
// The dashboard's live samples: rows of [server time, processed_total, failed_total,
// ...sizes by state] from each refresh of the page, kept once each and turned into the
// two live charts' series (queue sizes by state, and processed/failed per second).
//
// Each refresh sends the web process's last 30 minutes of samples again, so a row is
// known by its server time and kept once. Rows are mapped onto this browser's clock with
// the offset of the first refresh, once: an offset taken again at each refresh moves with
// the request's latency, and the same row, a few milliseconds later, was a second point
// whose rate read 0 (the throughput line fell to 0 between refreshes).
//
// A browser runs a hidden tab's timers about once a minute, so rows a minute apart are
// joined (their rate is the true mean over the minute); only rows further apart than
// `gap` seconds (nobody watched) break the lines.
(function () {
  "use strict";
  class LiveSeries {
    constructor(states, gap, maxPoints) {
      this.states = states;
      this.gap = gap;
      this.maxPoints = maxPoints;
      this.offset = null; // browser clock - server clock, from the first refresh
      this.last = null; // the newest row kept
      this.sizes = [[]].concat(states.map(() => []));
      this.rates = [[], [], []];
    }

    // Add the rows of one refresh (serverNow: the server's clock when it rendered them,
    // browserNow: this browser's when it got them); true when one was new.
    add(rows, serverNow, browserNow) {
      if (this.offset === null) this.offset = browserNow - serverNow;
      let added = false;
      for (const row of rows) {
        if (this.last !== null && row[0] <= this.last[0]) continue;
        this.push(row);
        added = true;
      }
      if (added) {
        [this.sizes, this.rates].forEach((d) => { while (d[0].length > this.maxPoints) d.forEach((a) => a.shift()); });
      }
      return added;
    }

    push(row) {
      const t = row[0] + this.offset;
      const prev = this.last;
      if (prev !== null && row[0] - prev[0] > this.gap) {
        // Nobody watched for a while: break the lines instead of joining across the gap.
        const at = prev[0] + this.offset + 1;
        this.sizes[0].push(at); this.sizes.slice(1).forEach((a) => a.push(null));
        this.rates[0].push(at); this.rates[1].push(null); this.rates[2].push(null);
      }
      this.sizes[0].push(t);
      this.states.forEach((s, i) => this.sizes[i + 1].push(row[3 + i] == null ? null : row[3 + i]));
      if (prev !== null && row[0] - prev[0] <= this.gap) {
        const dt = row[0] - prev[0];
        this.rates[0].push(t);
        this.rates[1].push(Math.max(0, (row[1] - prev[1]) / dt));
        this.rates[2].push(Math.max(0, (row[2] - prev[2]) / dt));
      }
      this.last = row;
    }
  }
  window.AsyncqLiveSeries = LiveSeries;

  // uPlot's points.filter: the indexes of the lone values of series si.
  window.asyncqLonePoints = function (u, si, show) {
    const ys = u.data[si];
    const out = [];
    for (let i = 0; i < ys.length; i++) {
      if (ys[i] != null && (i === 0 || ys[i - 1] == null) && (i === ys.length - 1 || ys[i + 1] == null)) out.push(i);
    }
    return show ? null : out; // where uPlot draws points anyway, all of them
  };
})();
