// zmqflow status --web: polls /api/snapshot (the tables) and /api/history (the curves) every interval.
// Every value arrives ready to show (jobs/status/view.py names the fields); nothing here knows a metric's name.
"use strict";

const state = { intervalMs: 1000, refreshes: 0, charts: {} };
window.zmqflowStatus = state;   // read by the browser test: refreshes, and each chart's point count

const COLUMNS = {
  tasks: [["task"], ["address"], ["status", "status"], ["service"], ["uptime_s", "seconds"], ["rtt_ms", "ms"], ["error", "error"]],
  queues: [["broker"], ["queue"], ["kind"], ["size", "num"], ["capacity", "capacity"], ["closed", "yesno"],
           ["waiting_enqueues", "num"], ["waiting_dequeues", "num"]],
  shards: [["shard"], ["step", "num"], ["steps_per_s", "num"], ["staleness_mean", "num"], ["staleness_max", "num"],
           ["pushes", "num"], ["dropped", "num"]],
  workers: [["worker"], ["state"], ["last_push_s", "ago"], ["metrics"], ["examples_per_s", "num"], ["loss", "loss"],
            ["global_step", "num"], ["steps", "num"]],
  aggregators: [["aggregator"], ["mode"], ["healthy", "healthy"], ["requests", "num"], ["failed", "num"],
                ["latency_p50_ms", "ms"], ["latency_p99_ms", "ms"], ["rtt_ms", "ms"]],
  members: [["aggregator"], ["member"], ["healthy", "flag"], ["answers", "num"], ["timeouts", "num"], ["errors", "num"],
            ["outstanding", "num"]],
};

function show(value, kind, row) {
  if (value === null || value === undefined) return ["-", ""];
  switch (kind) {
    case "num": return [typeof value === "number" ? value.toLocaleString(undefined, {maximumFractionDigits: 2}) : String(value), "num"];
    case "loss": return [value.toPrecision(4), "num"];
    case "seconds": return [value.toFixed(0) + " s", "num"];
    case "ago": return [value.toFixed(1) + " s ago", "num"];
    case "ms": return [value.toFixed(2) + " ms", "num"];
    case "capacity": return [String(value), "num"];
    case "flag": return value ? ["yes", "yes"] : ["no", "no"];
    case "yesno": return [value ? "yes" : "no", ""];
    case "healthy": return [value + "/" + row.members, value === row.members ? "yes" : "no"];
    case "status": return [value, "status"];
    case "error": return [value, "error"];
    default: return [String(value), ""];
  }
}

function fillTable(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    if (row.status) tr.className = row.status;
    tr.dataset.key = row[COLUMNS[id][0][0]];
    for (const [field, kind] of COLUMNS[id]) {
      const td = document.createElement("td");
      const [text, cls] = show(row[field], kind, row);
      td.textContent = text;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  if (!rows.length) {
    const tr = document.createElement("tr"), td = document.createElement("td");
    td.colSpan = COLUMNS[id].length; td.className = "empty"; td.textContent = "none";
    tr.appendChild(td); body.appendChild(tr);
  }
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

// Points whose x is known, sorted by x (uPlot wants ascending x), as uPlot's columns.
function columns(xs, ys) {
  const rows = xs.map((x, i) => [x, ...ys.map(y => y[i])]).filter(r => r[0] !== null && r.slice(1).some(v => v !== null));
  rows.sort((a, b) => a[0] - b[0]);
  return [rows.map(r => r[0]), ...ys.map((_, j) => rows.map(r => r[j + 1]))];
}

function drawChart(id, data, series, opts) {
  const el = document.getElementById(id);
  const key = series.map(s => s.label).join("|");
  let chart = state.charts[id];
  if (chart && chart.key !== key) { chart.plot.destroy(); chart = null; }
  if (!chart) {
    const width = Math.max(320, Math.min(560, window.innerWidth - 60));
    const plot = new uPlot({ width, height: 220, scales: { x: { time: !!opts.time } }, axes: opts.axes,
                             series: [{ label: opts.xLabel }, ...series] }, data, el);
    chart = state.charts[id] = { plot, key, points: 0 };
  } else {
    chart.plot.setData(data);
  }
  chart.points = data[0].length;
  el.dataset.points = String(chart.points);
}

function drawCharts(history) {
  const t = history.training;
  drawChart("chart-loss", columns(t.global_step, [t.loss]),
            [{ label: "loss", stroke: COLORS[0], width: 2 }], { xLabel: "global step" });
  const v = history.validation, names = Object.keys(v).filter(k => k !== "global_step");
  drawChart("chart-validation", columns(v.global_step, names.map(n => v[n])),
            names.map((n, i) => ({ label: n, stroke: COLORS[(i + 1) % COLORS.length], width: 2, points: { show: true } })),
            { xLabel: "global step" });
  drawChart("chart-rates", columns(t.time, [t.steps_per_s, t.examples_per_s]),
            [{ label: "ps steps/s", stroke: COLORS[2], width: 2, scale: "steps" },
             { label: "worker examples/s", stroke: COLORS[3], width: 2, scale: "examples" }],
            { xLabel: "time", time: true,
              axes: [{}, { scale: "steps", label: "steps/s" }, { scale: "examples", side: 1, label: "examples/s", grid: { show: false } }] });
}

async function refresh() {
  const updated = document.getElementById("updated");
  try {
    const [snap, history] = await Promise.all([fetch("/api/snapshot").then(r => r.json()),
                                               fetch("/api/history").then(r => r.json())]);
    state.intervalMs = Math.max(100, snap.interval_s * 1000);
    if (snap.snapshot) {
      for (const table of Object.keys(COLUMNS)) fillTable(table, snap.snapshot[table]);
      const down = snap.snapshot.tasks.filter(t => t.status === "down").length;
      updated.textContent = "updated " + new Date(snap.snapshot.time * 1000).toLocaleTimeString() +
        (down ? " \u2014 " + down + " task(s) down" : "");
      drawCharts(history);
      state.refreshes += 1;
      updated.dataset.refreshes = String(state.refreshes);
    }
    updated.classList.remove("stale");
  } catch (err) {
    updated.textContent = "no answer from the status server: " + err;
    updated.classList.add("stale");
  }
  setTimeout(refresh, state.intervalMs);
}

refresh();
