// The nexus-cache status page: polls /api/status every 2 s and renders it with
// DOM calls only. Every value from data or queries goes in through textContent
// or setAttribute, never as markup.
"use strict";
(function () {
  const REFRESH_MS = 2000;
  const SVG = "http://www.w3.org/2000/svg";
  const sorts = {};
  let refreshes = 0;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = Number(n), i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i ? v.toFixed(1) : String(v)) + " " + units[i];
  }

  function clock(t) {
    if (!t) return "–";
    return new Date(t * 1000).toLocaleTimeString();
  }

  function pct(part, whole) {
    return whole > 0 ? Math.max(0, Math.min(100, (100 * part) / whole)) : 0;
  }

  function segment(cls, part, whole, title) {
    const node = el("div", "seg " + cls);
    node.style.width = pct(part, whole) + "%";
    node.title = title + ": " + bytes(part);
    return node;
  }

  function legend(items) {
    const box = el("div", "legend");
    for (const [cls, label, value] of items) {
      const item = el("span");
      const swatch = el("i", "sw " + cls);
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(label + " " + bytes(value)));
      box.appendChild(item);
    }
    return box;
  }

  function renderDevices(devices) {
    const box = document.getElementById("devices");
    box.replaceChildren();
    for (const d of devices) {
      const total = d.managed_capacity_bytes || 0;
      const resident = d.resident_bytes_by_cache || {};
      const source = resident.source || 0;
      const graph = resident.graph || 0;
      const other = Math.max(0, (d.cache_charged_bytes || 0) - source - graph);
      const card = el("div", "device");
      card.dataset.device = d.device_id;
      card.appendChild(el("div", "title",
        "device " + d.device_id + " (" + d.backend + "): managed " + bytes(total) +
        ", cache cap " + bytes(d.cache_cap_bytes) +
        (d.admission_open ? "" : ", admission closed: " + (d.admission_closed_reason || ""))));
      const bar = el("div", "bar");
      bar.appendChild(segment("source", source, total, "source frames"));
      bar.appendChild(segment("graph", graph, total, "parked graphs"));
      bar.appendChild(segment("other", other, total, "reserved, retiring, quarantined"));
      bar.appendChild(segment("grants", d.grant_bytes || 0, total, "grants"));
      bar.appendChild(segment("free", d.free_managed_bytes || 0, total, "free"));
      const pinned = el("div", "pinned");
      pinned.style.width = pct(d.cache_pinned_in_use_bytes || 0, total) + "%";
      pinned.title = "pinned in use: " + bytes(d.cache_pinned_in_use_bytes);
      bar.appendChild(pinned);
      const cap = el("div", "cap");
      cap.style.left = pct(d.cache_cap_bytes || 0, total) + "%";
      cap.title = "cache cap: " + bytes(d.cache_cap_bytes);
      bar.appendChild(cap);
      card.appendChild(bar);
      card.appendChild(legend([
        ["source", "source", source], ["graph", "graph", graph],
        ["other", "reserved/retiring", other], ["grants", "grants (" + d.grant_count + ")",
          d.grant_bytes], ["free", "free", d.free_managed_bytes],
        ["pinned", "pinned in use", d.cache_pinned_in_use_bytes],
      ]));
      if (d.domain_used_bytes !== null && d.domain_used_bytes !== undefined) {
        const used = d.domain_used_bytes, held = Math.max(0, (d.domain_held_bytes || 0) - used);
        const dom = el("div", "bar thin");
        dom.appendChild(segment("domain", used, total, "allocation domain: live"));
        dom.appendChild(segment("held", held, total, "allocation domain: held"));
        card.appendChild(dom);
        card.appendChild(legend([
          ["domain", "allocation domain measured: live", used],
          ["held", "held", held], ["", "drift", d.drift_bytes],
        ]));
      }
      box.appendChild(card);
    }
  }

  function sparkline(points) {
    const w = 180, h = 28;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h);
    const known = points.filter((p) => p.rate !== null && p.rate !== undefined);
    if (known.length) {
      const t0 = points[0].t, span = Math.max(1, points[points.length - 1].t - t0);
      let xy = known.map((p) => [(w - 4) * (p.t - t0) / span + 2, h - 2 - (h - 4) * p.rate]);
      if (xy.length === 1) xy = [[2, xy[0][1]], [w - 2, xy[0][1]]];  // one interval: a level
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" "));
      svg.appendChild(line);
    }
    return svg;
  }

  function renderRates(data) {
    const box = document.getElementById("rates");
    box.replaceChildren();
    for (const cache of ["lakehouse", "source", "graph"]) {
      const points = (data.hit_rates || {})[cache] || [];
      const statuses = (data.requests || {})[cache] || {};
      let hits = 0, lookups = 0;
      for (const p of points) { hits += p.hits; lookups += p.lookups; }
      const row = el("div", "rate");
      row.dataset.cache = cache;
      row.appendChild(el("span", "name", cache));
      row.appendChild(sparkline(points));
      const rate = lookups ? (100 * hits / lookups).toFixed(0) + "% of " + lookups : "no lookups";
      const since = Object.entries(statuses).map(([s, n]) => s + " " + n).join(", ");
      row.appendChild(el("span", "", rate + " (since start: " + (since || "none") + ")"));
      box.appendChild(row);
    }
    const a = data.admission || {};
    document.getElementById("admission").textContent =
      "admission waits " + (a.waits || 0) + ", refusals " + (a.refusals || 0);
  }

  function renderLakehouse(lake) {
    const box = document.getElementById("lakehouse");
    box.replaceChildren();
    const whole = lake.max_bytes || lake.bytes || 0;
    const bar = el("div", "bar");
    bar.appendChild(segment("source", lake.bytes || 0, whole, "cached bytes"));
    box.appendChild(bar);
    const reads = Object.entries(lake.reads || {}).map(([s, n]) => s + " " + n).join(", ");
    box.appendChild(el("p", "",
      bytes(lake.bytes) + " of MAX_BYTES " + (lake.max_bytes ? bytes(lake.max_bytes) : "unset") +
      " in " + (lake.entries === null || lake.entries === undefined ? "–" : lake.entries) +
      " entries; fills in flight " + (lake.fills_in_flight || 0) +
      ", background fills pending " + (lake.background_fills_pending || 0)));
    box.appendChild(el("p", "", "root " + (lake.root || "none") + "; reads: " + (reads || "none")));
  }

  // columns: [key, label, kind] with kind "num", "bytes", "time", "wrap" or ""
  function renderTable(id, columns, rows, extra) {
    const table = document.getElementById(id);
    const state = sorts[id] || (sorts[id] = { key: null, asc: false });
    table.replaceChildren();
    const head = el("tr");
    for (const [key, label] of columns) {
      const th = el("th", state.key === key ? "sorted" + (state.asc ? " asc" : "") : "", label);
      th.addEventListener("click", () => {
        state.asc = state.key === key ? !state.asc : false;
        state.key = key;
        renderTable(id, columns, rows, extra);
      });
      head.appendChild(th);
    }
    if (extra) head.appendChild(el("th", "", ""));
    const thead = el("thead"); thead.appendChild(head); table.appendChild(thead);
    const body = el("tbody");
    let sorted = rows.slice();
    if (state.key) {
      const k = state.key, sign = state.asc ? 1 : -1;
      sorted.sort((a, b) => {
        const x = a[k], y = b[k];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sign;
      });
    }
    if (!sorted.length) {
      const tr = el("tr"); const td = el("td", "empty", "none");
      td.colSpan = columns.length + (extra ? 1 : 0); tr.appendChild(td); body.appendChild(tr);
    }
    for (const row of sorted) {
      const tr = el("tr");
      for (const [key, , kind] of columns) {
        let value = row[key];
        if (kind === "bytes") value = bytes(value);
        else if (kind === "time") value = clock(value);
        else if (Array.isArray(value)) value = value.join(", ");
        else if (value === null || value === undefined) value = "–";
        const cls = (kind === "num" || kind === "bytes" ? "num" : kind === "wrap" ? "wrap" : "") +
          (key === "outcome" ? " outcome-" + row.outcome : "");
        const td = el("td", cls.trim(), value);
        if (key === "query" && row.query_json) td.title = row.query_json;
        tr.appendChild(td);
      }
      if (extra) { const td = el("td"); extra(row, td); tr.appendChild(td); }
      body.appendChild(tr);
    }
    table.appendChild(body);
  }

  function cancelButton(row, td) {
    const button = el("button", "", row.cancelling ? "cancelling…" : "cancel");
    button.disabled = !!row.cancelling;
    button.addEventListener("click", () => {
      button.disabled = true;
      fetch("/api/cancel/" + encodeURIComponent(row.run_id), {
        method: "POST", credentials: "same-origin",
      }).then(refresh);
    });
    td.appendChild(button);
  }

  function render(data) {
    const h = data.health || {};
    document.getElementById("summary").textContent =
      (h.backend || "") + " · devices " + (h.devices || []).join(",") + " · running " +
      (h.running_queries || 0) + "/" + (h.max_running_queries || "?") + " · " +
      (h.status || "") + " · v" + (h.version || "");
    renderDevices(data.devices || []);
    renderRates(data);
    renderLakehouse(data.lakehouse || {});
    renderTable("running", [["run_id", "id", "num"], ["type", "type"], ["query", "query", "wrap"],
      ["started_at", "started", "time"], ["ms", "ms", "num"]], data.running || [], cancelButton);
    renderTable("recent", [["query_id", "id"], ["type", "type"], ["query", "query", "wrap"],
      ["lakehouse", "lakehouse"], ["source", "source"], ["graph", "graph"],
      ["rows", "rows", "num"], ["attempts", "attempts", "num"], ["outcome", "outcome"],
      ["ms", "ms", "num"], ["message", "message", "wrap"]], data.recent || []);
    renderTable("sources", [["device", "device", "num"], ["object", "object", "wrap"],
      ["columns", "columns", "wrap"], ["bytes", "bytes", "bytes"], ["pins", "pins", "num"],
      ["hits", "hits", "num"], ["last_used_at", "last use", "time"]],
      (data.sources || []).map((r) => Object.assign({}, r, { columns: r.columns || "all" })));
    renderTable("graphs", [["device", "device", "num"], ["key", "key", "wrap"],
      ["vertices", "vertices", "num"], ["edges", "edges", "num"], ["bytes", "bytes", "bytes"],
      ["pins", "pins", "num"], ["hits", "hits", "num"], ["last_used_at", "last use", "time"]],
      data.graphs || []);
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    document.getElementById("updated").textContent = "updated " + clock(data.time);
  }

  function problem(text) {
    const node = document.getElementById("problem");
    node.hidden = !text;
    node.textContent = text || "";
  }

  function refresh() {
    return fetch("/api/status", { credentials: "same-origin", cache: "no-store" })
      .then((r) => {
        if (r.status === 401) { window.location.reload(); throw new Error("token needed"); }
        if (!r.ok) throw new Error("the server answered " + r.status);
        return r.json();
      })
      .then((data) => { problem(null); render(data); })
      .catch((err) => problem("status not updated: " + err.message));
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
})();
