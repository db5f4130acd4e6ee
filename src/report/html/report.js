"use strict";
// scalene-rs HTML report: builds the page from the JSON in #data. Text from the profile is
// only ever set as textContent, never parsed as markup.
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const app = document.getElementById("app");
  const MEM = !!D.mem;
  const GPU = !!D.gpu;
  // Where a line row's GPU values start (after the memory ones, when there are).
  const GI = MEM ? 10 : 5;

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "class") e.className = attrs[k];
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of kids) {
      if (c === null || c === undefined) continue;
      e.append(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  function sv(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  // Same rounding as the terminal report: blank for nothing, "<1%" for a sliver.
  function pct(v) {
    if (!(v >= 0.005)) return "";
    if (v < 1) return "<1%";
    return Math.round(v) + "%";
  }
  function mb(v) {
    if (!(v >= 0.05)) return "";
    return v < 10 ? v.toFixed(1) + "M" : Math.round(v) + "M";
  }
  function secs(s) {
    return s >= 1 ? s.toFixed(2) + " s" : s >= 0.001 ? (s * 1e3).toFixed(1) + " ms" : (s * 1e6).toFixed(0) + " µs";
  }
  function kib(k) {
    return k >= 1024 * 1024 ? (k / 1048576).toFixed(2) + " GiB" : k >= 1024 ? (k / 1024).toFixed(1) + " MiB" : k + " KiB";
  }

  // ---- header -------------------------------------------------------------------------
  app.append(el("h1", {}, D.title));
  const head = el("table", { class: "head", id: "header" });
  for (const [label, text, em] of D.header) {
    head.append(el("tr", {}, el("th", {}, label ? label + ":" : ""), el("td", { class: em ? "em" : "" }, text)));
  }
  app.append(head);
  const toc = el("nav", { class: "toc" });
  app.append(toc);
  function section(id, title) {
    const h = el("h2", { id: id }, title);
    app.append(h);
    toc.append(el("a", { href: "#" + id }, title));
    return h;
  }
  const legend = () =>
    el("div", { class: "legend note" },
      el("span", {}, el("i", { class: "sw py" }), D.unsplit ? "Python or native" : "Python"),
      D.unsplit ? null : el("span", {}, el("i", { class: "sw na" }), "native"),
      el("span", {}, el("i", { class: "sw sy" }), D.wall ? "system (kernel + off-CPU)" : "system"));

  // ---- memory timeline ------------------------------------------------------------------
  function chart(points, w, h, unit) {
    unit = unit || "MB";
    const s = sv("svg", { class: "chart", width: w, height: h + 28, viewBox: `0 0 ${w} ${h + 28}`, role: "img" });
    const maxT = Math.max(1e-9, ...points.map((p) => p[0]));
    const maxV = Math.max(1e-9, ...points.map((p) => p[1]));
    const x = (t) => 50 + (t / maxT) * (w - 60);
    const y = (v) => 8 + h - (v / maxV) * h;
    const pts = points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ");
    s.append(sv("polygon", { class: "area", points: `${x(points[0][0])},${y(0)} ${pts} ${x(points[points.length - 1][0])},${y(0)}` }));
    s.append(sv("polyline", { class: "ln", points: pts }));
    s.append(sv("line", { class: "ax", x1: 50, y1: y(0), x2: w - 10, y2: y(0) }));
    s.append(sv("line", { class: "ax", x1: 50, y1: 8, x2: 50, y2: y(0) }));
    const t = (x0, y0, str, anchor) => {
      const e = sv("text", { x: x0, y: y0, "text-anchor": anchor || "start" });
      e.textContent = str;
      s.append(e);
    };
    t(46, 16, (maxV >= 100 ? Math.round(maxV) : maxV.toFixed(1)) + " " + unit, "end");
    t(46, y(0), "0", "end");
    t(50, h + 26, "0 s");
    t(w - 10, h + 26, maxT.toFixed(2) + " s", "end");
    return s;
  }
  if (MEM && D.mem.timeline.length > 1) {
    section("memory", "Memory over time");
    app.append(el("div", { class: "note" }, `The program's sampled live footprint; peak ${D.mem.peak.toFixed(1)} MB.`));
    app.append(chart(D.mem.timeline, 760, 140));
  }
  if (GPU && D.gpu.timeline.length > 1) {
    section("gpu", "GPU over time");
    const names = D.gpu.devices.map((d) => d[1]).join(", ");
    app.append(el("div", { class: "note" }, `How busy the program's processes kept ${names} (SM use, % of one GPU; ${D.gpu.busy.toFixed(2)} GPU-s in all), and the GPU memory they held (peak ${D.gpu.peak.toFixed(0)} MB).`));
    app.append(chart(D.gpu.timeline.map((p) => [p[0], p[1]]), 760, 100, "%"));
    app.append(chart(D.gpu.timeline.map((p) => [p[0], p[2]]), 760, 100, "MB"));
  }

  // ---- files and their lines -------------------------------------------------------------
  // Line rows: [line, py, native, system, source, (memPython, peak, copy, alloc, timeline),
  // (gpu %, gpu memory peak)].
  const COLS = [
    { key: "line", title: "Line", get: (r) => r.line, cls: "ln" },
    { key: "py", title: D.unsplit ? "Time Py + native" : "Time Python", get: (r) => r.py, bar: "py" },
  ];
  if (!D.unsplit) COLS.push({ key: "na", title: "native", get: (r) => r.na, bar: "na" });
  COLS.push({ key: "sy", title: "system", get: (r) => r.sy, bar: "sy" });
  if (MEM) {
    COLS.push({ key: "mp", title: "Memory Python", get: (r) => r.mp, bar: "mp" });
    COLS.push({ key: "peak", title: "peak", get: (r) => r.peak, fmt: mb });
    COLS.push({ key: "tl", title: "timeline", get: (r) => (r.tl ? Math.max(0, ...r.tl) : -1), spark: true });
    COLS.push({ key: "copy", title: "Copy MB/s", get: (r) => r.copy, fmt: (v) => (v >= 0.005 ? v.toFixed(v < 10 ? 2 : 0) : "") });
  }
  if (GPU) {
    COLS.push({ key: "gp", title: "GPU", get: (r) => r.gp, bar: "gp" });
    COLS.push({ key: "gm", title: "GPU mem", get: (r) => r.gm, fmt: mb });
  }
  COLS.push({ key: "src", title: "Source", get: (r) => r.src, text: true });

  const hottest = D.hottest;
  const CONTEXT = D.context;
  function rowsOf(fi) {
    const f = D.files[fi];
    if (f._rows) return f._rows;
    const rows = f.l.map((a) => ({
      line: a[0], py: a[1], na: a[2], sy: a[3], src: a[4], prof: true,
      mp: a.length > 5 ? a[5] : 0, peak: a.length > 5 ? a[6] : 0, copy: a.length > 5 ? a[7] : 0,
      alloc: a.length > 5 ? a[8] : 0, tl: a.length > 5 ? a[9] : null,
      gp: GPU ? a[GI] : 0, gm: GPU ? a[GI + 1] : 0,
    }));
    for (const r of rows) {
      const t = r.py + r.na + r.sy;
      r.hot = t >= D.hot || (hottest && hottest[0] === fi && hottest[1] === r.line);
      if (f.full && !r.src && r.line >= 1) r.src = f.full[r.line - 1] || "";
    }
    f._rows = rows;
    return rows;
  }
  function blankRow(line, src) {
    return { line, py: 0, na: 0, sy: 0, mp: 0, peak: 0, copy: 0, alloc: 0, tl: null, gp: 0, gm: 0, src: src || "", prof: false };
  }
  // The rows to show: profiled lines (and their context), or every line of the file.
  function shownRows(fi, all) {
    const f = D.files[fi];
    const prof = rowsOf(fi);
    const byLine = new Map(prof.map((r) => [r.line, r]));
    if (all && f.full) {
      const out = f.full.map((s, i) => byLine.get(i + 1) || blankRow(i + 1, s));
      for (const r of prof) if (r.line < 1 || r.line > f.full.length) out.push(r);
      return out.sort((a, b) => a.line - b.line);
    }
    const out = prof.slice();
    if (f.full) {
      // The lines within CONTEXT of a profiled line, as the profile's context has them.
      const near = new Set();
      for (const r of prof) for (let n = r.line - CONTEXT; n <= r.line + CONTEXT; n++) if (n >= 1 && n <= f.full.length && !byLine.has(n)) near.add(n);
      for (const n of near) out.push(blankRow(n, f.full[n - 1]));
    } else for (const [line, s] of f.ctx) if (!byLine.has(line)) out.push(blankRow(line, s));
    return out.sort((a, b) => a.line - b.line);
  }
  function spark(tl) {
    const w = 80, h = 16;
    const s = sv("svg", { class: "spark", width: w, height: h, viewBox: `0 0 ${w} ${h}` });
    if (!tl || !tl.length) return s;
    const max = Math.max(...tl);
    if (!(max > 0)) return s;
    const step = tl.length > 1 ? w / (tl.length - 1) : 0;
    s.append(sv("polyline", { points: tl.map((v, i) => (i * step).toFixed(1) + "," + (h - 1 - (v / max) * (h - 2)).toFixed(1)).join(" ") }));
    return s;
  }
  function cell(col, r) {
    const v = col.get(r);
    if (col.cls === "ln") return el("td", { class: "ln" }, v);
    if (col.text) return el("td", { class: "src" }, v);
    if (col.spark) return el("td", {}, r.tl ? spark(r.tl) : null);
    if (col.bar) {
      const td = el("td", { class: "n bar " + col.bar });
      if (v >= 0.005) {
        td.append(el("i", { style: `width:${Math.min(100, v).toFixed(1)}%` }));
        td.append(el("span", {}, pct(v)));
      }
      return td;
    }
    return el("td", { class: "n" }, col.fmt(v));
  }
  function lineRow(fi, r) {
    const tr = el("tr", { id: `L${fi}-${r.line}`, class: r.hot ? "hot" : r.prof ? "" : "ctx" });
    tr.dataset.line = r.line;
    if (r.hot) tr.title = `hot line: ${pct(r.py + r.na + r.sy)} of the time`;
    for (const c of COLS) tr.append(cell(c, r));
    return tr;
  }
  // --native: rows under a line that say which native functions its native time went to
  // (`nf`), and which its allocations came from (`mf`, with memory); none for a line with
  // nothing worth showing.
  function nativeRows(fi, r) {
    const rows = [];
    const add = (list, min, label, fmt) => {
      const shown = list ? list.filter((n) => n[2] >= min).slice(0, 3) : [];
      if (!shown.length) return;
      const more = list.length > shown.length ? ", …" : "";
      const tr = el("tr", { class: "nf" });
      tr.dataset.line = r.line;
      tr.append(el("td", {}), el("td", {
        colspan: COLS.length - 1,
        title: list.map((n) => `${n[0]} (${n[1]}): ${fmt(n[2])}`).join("\n"),
      }, label + shown.map((n) => `${n[0]} ${fmt(n[2])}`).join(", ") + more));
      rows.push(tr);
    };
    const f = D.files[fi];
    add(f.nf && f.nf[r.line], 0.1, "↳ native: ", (v) => pct(v) || "<1%");
    add(f.mf && f.mf[r.line], 0.05, "↳ allocated in: ", (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)) + "M");
    return rows;
  }
  // A sortable table: clicking a heading sorts by it (numbers largest first, then
  // smallest first on a second click; text and line numbers ascending first).
  function sortableHead(cols, state, redraw) {
    const tr = el("tr");
    cols.forEach((c) => {
      const th = el("th", { class: c.text || c.cls === "ln" || c.left ? "l" : "" });
      th.dataset.key = c.key;
      if (state.key === c.key) th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
      th.append(el("button", {
        type: "button", title: "sort by " + c.title,
        onclick: () => {
          const asc = c.text || c.cls === "ln" || c.left;
          if (state.key === c.key) state.dir = -state.dir;
          else { state.key = c.key; state.dir = asc ? 1 : -1; }
          redraw();
        },
      }, c.title));
      tr.append(th);
    });
    return el("thead", {}, tr);
  }
  function sortRows(rows, cols, state) {
    const c = cols.find((x) => x.key === state.key);
    const get = c.get;
    return rows.slice().sort((a, b) => {
      const x = get(a), y = get(b);
      const d = typeof x === "string" ? x.localeCompare(y) : x - y;
      return d * state.dir || a.line - b.line;
    });
  }
  function buildFile(fi, det) {
    const f = D.files[fi];
    const state = { key: "line", dir: 1, all: false };
    const body = el("div");
    const allBox = el("input", { type: "checkbox", class: "all-lines" });
    if (!f.full) { allBox.disabled = true; }
    allBox.addEventListener("change", () => { state.all = allBox.checked; redraw(); });
    const count = el("span", { class: "count" });
    body.append(el("div", { class: "tools" },
      el("label", { title: f.full ? "" : "the profile does not carry this file's whole text" }, allBox,
        f.full ? " show all lines" : " show all lines (file text not in the profile)"),
      count));
    const wrap = el("div", { class: "wrap" });
    body.append(wrap);
    function redraw() {
      const rows = shownRows(fi, state.all);
      const sorted = state.key === "line" && state.dir === 1 ? rows : sortRows(rows, COLS, state);
      const table = el("table", { class: "t lines" });
      table.append(sortableHead(COLS, state, redraw));
      const tb = el("tbody");
      let prev = null;
      const frag = document.createDocumentFragment();
      for (const r of sorted) {
        if (state.key === "line" && state.dir === 1 && prev !== null && r.line > prev + 1) {
          frag.append(el("tr", { class: "gap" }, el("td", { colspan: COLS.length }, "…")));
        }
        prev = r.line;
        frag.append(lineRow(fi, r));
        for (const nr of nativeRows(fi, r)) frag.append(nr);
      }
      tb.append(frag);
      table.append(tb);
      wrap.replaceChildren(table);
      count.textContent = `${rows.filter((r) => r.prof).length} profiled lines, ${rows.length} shown`;
    }
    f._show = (line) => {
      if (!document.getElementById(`L${fi}-${line}`) && f.full && !state.all) {
        state.all = allBox.checked = true;
        redraw();
      }
    };
    redraw();
    det.append(body);
  }
  function fileDetails(fi) {
    const f = D.files[fi];
    const det = el("details", { class: "file", id: "F" + fi });
    det.append(el("summary", {}, el("span", { class: "fname" }, f.n),
      el("span", { class: "fpct" }, `${pct(f.pct) || "0%"} of the time · ${f.l.length} lines`)));
    det.addEventListener("toggle", () => {
      if (det.open && !f._built) { f._built = true; buildFile(fi, det); }
    });
    return det;
  }
  function openLine(fileName, line) {
    const fi = D.files.findIndex((f) => f.n === fileName);
    if (fi < 0) return;
    const det = document.getElementById("F" + fi);
    if (!det.open) det.open = true;
    if (!D.files[fi]._built) { D.files[fi]._built = true; buildFile(fi, det); }
    D.files[fi]._show(line);
    const tr = document.getElementById(`L${fi}-${line}`);
    if (tr) {
      tr.scrollIntoView({ block: "center" });
      tr.classList.remove("flash");
      void tr.offsetWidth;
      tr.classList.add("flash");
    }
  }
  if (D.files.length) {
    section("files", "Lines");
    app.append(legend());
    app.append(el("div", { class: "note" },
      `Every percentage is a share of the ${D.total.toFixed(2)} s attributed. Hot lines (at least ${D.hot}% of the time, or the busiest) are highlighted; click a column's heading to sort by it.`));
    D.files.forEach((f, fi) => {
      const det = fileDetails(fi);
      app.append(det);
      if (fi === 0 || (fi < 5 && f.pct >= D.matter)) det.open = true;
    });
  } else {
    app.append(el("p", {}, "No time was attributed to any Python line."));
  }

  // ---- functions ----------------------------------------------------------------------------
  function plainTable(id, cols, rows, initial, limit) {
    const state = Object.assign({ dir: -1 }, initial);
    const holder = el("div", { class: "wrap", id: id });
    function redraw() {
      const t = el("table", { class: "t" });
      t.append(sortableHead(cols, state, redraw));
      const tb = el("tbody");
      const sorted = sortRows(rows, cols, state);
      for (const r of sorted.slice(0, limit || sorted.length)) {
        const tr = el("tr");
        for (const c of cols) {
          if (c.render) tr.append(c.render(r));
          else if (c.bar) tr.append(cell(c, r));
          else tr.append(el("td", { class: c.left || c.text ? "" : "n" }, c.fmt ? c.fmt(c.get(r)) : c.get(r)));
        }
        tb.append(tr);
      }
      t.append(tb);
      holder.replaceChildren(t);
      if (limit && rows.length > limit) holder.append(el("div", { class: "note" }, `${rows.length - limit} more not shown (all in the profile JSON).`));
    }
    redraw();
    return holder;
  }
  const lineLink = (file, line) =>
    el("a", { href: "#", onclick: (e) => { e.preventDefault(); openLine(file, line); } }, `${file}:${line}`);
  const fns = [];
  D.files.forEach((f) => f.fn.forEach((g) => fns.push({ name: g[0], file: f.n, line: g[1], py: g[2], na: g[3], sy: g[4] })));
  if (fns.length) {
    section("functions", "Functions");
    const tcols = [
      { key: "tot", title: "Time", get: (r) => r.py + r.na + r.sy, fmt: pct },
      { key: "py", title: COLS[1].title, get: (r) => r.py, bar: "py" },
    ];
    if (!D.unsplit) tcols.push({ key: "na", title: "native", get: (r) => r.na, bar: "na" });
    tcols.push({ key: "sy", title: "system", get: (r) => r.sy, bar: "sy" });
    tcols.push({ key: "name", title: "Function", get: (r) => r.name, text: true,
      render: (r) => el("td", {}, el("code", {}, r.name), " ", r.line ? lineLink(r.file, r.line) : el("span", { class: "note" }, r.file)) });
    app.append(plainTable("functions-table", tcols, fns, { key: "tot" }, 200));
  }

  // ---- leaks ------------------------------------------------------------------------------------
  if (MEM && D.mem.leaks.length) {
    section("leaks", "Likely leaks");
    const rows = D.mem.leaks.map((l) => ({ file: l[0], line: l[1], lik: l[2], growth: l[3], allocs: l[4], frees: l[5] }));
    app.append(plainTable("leaks-table", [
      { key: "where", title: "Line", text: true, get: (r) => r.file + ":" + r.line, render: (r) => el("td", {}, lineLink(r.file, r.line)) },
      { key: "lik", title: "Likelihood", get: (r) => r.lik, fmt: (v) => (v * 100).toFixed(0) + "%" },
      { key: "growth", title: "Growth MB/s", get: (r) => r.growth, fmt: (v) => v.toFixed(2) },
      { key: "allocs", title: "Sampled allocs", get: (r) => r.allocs },
      { key: "frees", title: "frees", get: (r) => r.frees },
    ], rows, { key: "lik" }));
  }

  // ---- processes and threads -------------------------------------------------------------------
  if (D.procs) {
    section("processes", "Processes");
    const rows = D.procs.map((p) => ({ pid: p[0], cmd: p[1], py: p[2], samples: p[3], cpu: p[4], peak: p[5], alloc: p[6], gp: p[7], gm: p[8] }));
    const cols = [
      { key: "pid", title: "PID", get: (r) => r.pid },
      { key: "cpu", title: "Time", get: (r) => r.cpu, fmt: pct },
      { key: "samples", title: "Samples", get: (r) => r.samples },
    ];
    if (MEM) {
      cols.push({ key: "peak", title: "Peak", get: (r) => r.peak || 0, fmt: mb });
      cols.push({ key: "alloc", title: "Allocated", get: (r) => r.alloc || 0, fmt: mb });
    }
    if (GPU) {
      cols.push({ key: "gp", title: "GPU", get: (r) => r.gp || 0, fmt: pct });
      cols.push({ key: "gm", title: "GPU mem", get: (r) => r.gm || 0, fmt: mb });
    }
    cols.push({ key: "pyv", title: "Python", get: (r) => r.py, text: true });
    cols.push({ key: "cmd", title: "Command", get: (r) => r.cmd, text: true, render: (r) => el("td", { class: "mono" }, r.cmd) });
    app.append(plainTable("processes-table", cols, rows, { key: "cpu" }));
  }
  if (D.threads && D.threads.length) {
    section("threads", "Threads");
    const rows = D.threads.map((t) => ({ tid: t[0], name: t[1] || "", samples: t[2], py: t[3], na: t[4], sy: t[5] }));
    const cols = [
      { key: "tid", title: "TID", get: (r) => r.tid },
      { key: "samples", title: "Samples", get: (r) => r.samples },
      { key: "tot", title: "Time", get: (r) => r.py + r.na + r.sy, fmt: pct },
      { key: "py", title: COLS[1].title, get: (r) => r.py, bar: "py" },
    ];
    if (!D.unsplit) cols.push({ key: "na", title: "native", get: (r) => r.na, bar: "na" });
    cols.push({ key: "sy", title: "system", get: (r) => r.sy, bar: "sy" });
    cols.push({ key: "name", title: "Name", get: (r) => r.name, text: true });
    app.append(plainTable("threads-table", cols, rows, { key: "tot" }));
  }

  // ---- flame graphs ---------------------------------------------------------------------------
  // Trees come in preorder: f (frame index, -1 for the root), v (value), c (child count),
  // and the split's shares in percent (p, n, s for time; p for memory).
  const PY = [63, 127, 196], NA = [58, 154, 91], SY = [217, 130, 43], UNK = [160, 160, 160], GPUC = [142, 92, 180];
  function decode(t) {
    const N = t.f.length;
    const kids = new Array(N), depth = new Int32Array(N), parent = new Int32Array(N);
    const st = [];
    for (let i = 0; i < N; i++) {
      kids[i] = [];
      parent[i] = -1;
      if (st.length) {
        const top = st[st.length - 1];
        parent[i] = top.i;
        kids[top.i].push(i);
        top.r--;
      }
      depth[i] = st.length;
      if (t.c[i] > 0) st.push({ i, r: t.c[i] });
      while (st.length && st[st.length - 1].r === 0) st.pop();
    }
    return { t, N, kids, depth, parent };
  }
  function frameText(fi) {
    if (fi < 0) return { name: "all", where: "" };
    const n = D.names[D.frames[3 * fi]], file = D.names[D.frames[3 * fi + 1]], line = D.frames[3 * fi + 2];
    return { name: n || "?", where: file + (line ? ":" + line : "") };
  }
  function color(t, i, memory) {
    if (!t.p) return `rgb(${GPUC[0]},${GPUC[1]},${GPUC[2]})`;
    const p = t.p[i] / 100, n = t.n[i] / 100, s = memory ? 0 : t.s[i] / 100;
    const u = Math.max(0, 1 - p - n - s);
    const c = [0, 1, 2].map((k) => Math.round(p * PY[k] + n * NA[k] + s * SY[k] + u * UNK[k]));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  function flame(id, title, tree, memory, describe) {
    section(id, title);
    const G = decode(tree);
    const t = tree;
    const search = el("input", { type: "search", placeholder: "search functions or files (regular expression)", class: "fg-search" });
    const reset = el("button", { type: "button", class: "fg-reset" }, "Reset zoom");
    const info = el("div", { class: "fg-info" }, "Click a frame to zoom in; click the top frame (or Reset zoom) to zoom out.");
    const holder = el("div", { class: "fg-holder" });
    const lg = memory === "gpu"
      ? el("div", { class: "legend note" }, el("span", {}, el("i", { class: "sw gp" }), "GPU busy time (SM use × time)"), el("span", {}, "width: GPU time"))
      : memory
      ? el("div", { class: "legend note" }, el("span", {}, el("i", { class: "sw py" }), "allocated by Python"), el("span", {}, el("i", { class: "sw na" }), "native"), el("span", {}, el("i", { class: "sw unk" }), "unknown"), el("span", {}, "width: KiB allocated"))
      : el("div", { class: "legend note" }, el("span", {}, el("i", { class: "sw py" }), "Python"), el("span", {}, el("i", { class: "sw na" }), "native"), el("span", {}, el("i", { class: "sw sy" }), "system"), el("span", {}, el("i", { class: "sw unk" }), "no split"), el("span", {}, "width: time"));
    app.append(el("div", { class: "fg-bar" }, search, reset), lg, info, holder);
    let zoom = 0;
    let re = null;
    const ROW = 18;
    function draw() {
      const W = Math.max(600, holder.clientWidth || 1000);
      const total = t.v[zoom] || 1;
      const items = [];
      // Ancestors of the zoomed frame, full width, above it.
      const anc = [];
      for (let a = G.parent[zoom]; a >= 0; a = G.parent[a]) anc.unshift(a);
      anc.forEach((a, d) => items.push([a, 0, W, d, true]));
      const base = anc.length;
      let maxD = base;
      const stack = [[zoom, 0, base]];
      while (stack.length) {
        const [i, x, d] = stack.pop();
        const w = (t.v[i] / total) * W;
        if (w < 0.4) continue;
        items.push([i, x, w, d, false]);
        if (d > maxD) maxD = d;
        let cx = x;
        for (const k of G.kids[i]) {
          stack.push([k, cx, d + 1]);
          cx += (t.v[k] / total) * W;
        }
      }
      const svg = sv("svg", { class: "fg", width: W, height: (maxD + 1) * ROW, viewBox: `0 0 ${W} ${(maxD + 1) * ROW}` });
      let matched = 0;
      const matchedRoots = new Set();
      for (const [i, x, w, d, isAnc] of items) {
        const ft = frameText(t.f[i]);
        const g = sv("g", { class: isAnc ? "anc" : "" });
        g.dataset.i = i;
        const full = `${ft.name}${ft.where ? " (" + ft.where + ")" : ""}`;
        if (re && t.f[i] >= 0 && (re.test(ft.name) || re.test(ft.where))) {
          g.classList.add("match");
          let a = G.parent[i], under = false;
          for (; a >= 0; a = G.parent[a]) if (matchedRoots.has(a)) { under = true; break; }
          matchedRoots.add(i);
          if (!under && !isAnc) matched += t.v[i];
        }
        const r = sv("rect", { x: x.toFixed(2), y: d * ROW, width: Math.max(0.5, w - 0.5).toFixed(2), height: ROW - 1, fill: color(t, i, memory), rx: 2 });
        const tip = sv("title");
        tip.textContent = full + "\n" + describe(t.v[i], t.v[0], t, i);
        g.append(tip, r);
        if (w > 30) {
          const tx = sv("text", { x: (x + 3).toFixed(1), y: d * ROW + 13 });
          const chars = Math.floor((w - 6) / 6.6);
          tx.textContent = full.length > chars ? full.slice(0, Math.max(0, chars - 1)) + "…" : full;
          g.append(tx);
        }
        g.addEventListener("click", () => {
          zoom = i === zoom && G.parent[i] >= 0 ? G.parent[i] : i;
          draw();
          info.textContent = zoom === 0 ? "Whole graph." : `Zoomed to ${full}: ${describe(t.v[zoom], t.v[0], t, zoom)}`;
        });
        g.addEventListener("mouseenter", () => { info.textContent = full + " — " + describe(t.v[i], t.v[0], t, i); });
        svg.append(g);
      }
      holder.replaceChildren(svg);
      holder.dataset.zoom = zoom;
      if (re) info.textContent = `Matched ${(100 * matched / (t.v[0] || 1)).toFixed(1)}% of the whole graph.`;
    }
    reset.addEventListener("click", () => { zoom = 0; draw(); info.textContent = "Whole graph."; });
    search.addEventListener("input", () => {
      try { re = search.value ? new RegExp(search.value, "i") : null; } catch (e) { re = null; info.textContent = "not a regular expression: " + e.message; return; }
      draw();
      if (!re) info.textContent = zoom === 0 ? "Whole graph." : "Search cleared.";
    });
    // Drawn when first scrolled to (or right away without IntersectionObserver).
    if ("IntersectionObserver" in window) {
      const io = new IntersectionObserver((es) => { if (es.some((e) => e.isIntersecting)) { io.disconnect(); draw(); } });
      io.observe(holder);
      holder.style.minHeight = "40px";
    } else draw();
    holder._draw = draw;
  }
  if (D.ft && D.ft.v.length && D.ft.v[0] > 0) {
    flame("flame-time", "Flame graph: time", D.ft, false, (v, tot, t, i) => {
      const split = D.unsplit ? "" : ` — Python ${t.p[i]}%, native ${t.n[i]}%, system ${t.s[i]}%`;
      return `${secs(v / 1e6)}, ${(100 * v / tot).toFixed(1)}%${split}`;
    });
  }
  if (MEM && D.mem.tree.v.length && D.mem.tree.v[0] > 0) {
    flame("flame-memory", "Flame graph: memory allocated", D.mem.tree, true, (v, tot, t, i) =>
      `${kib(v)}, ${(100 * v / tot).toFixed(1)}% — Python ${t.p[i]}%`);
  }
  if (GPU && D.gpu.tree.v.length && D.gpu.tree.v[0] > 0) {
    flame("flame-gpu", "Flame graph: GPU time", D.gpu.tree, "gpu", (v, tot) =>
      `${secs(v / 1e6)} of GPU time, ${(100 * v / tot).toFixed(1)}%`);
  }
  window.scaleneReport = { data: D, openLine };
})();
