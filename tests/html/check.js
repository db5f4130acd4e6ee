// Checks an HTML report in headless Chromium (driven by playwright-core), for tests/html.rs.
//
//   node tests/html/check.js SPEC.json
//
// SPEC: { html, screenshot, screenshot_at?: "selector" (one screen from there instead of the
//         full page), chromium, hottest?: {file, line, cells: [..], source?}, markup?: "text",
//         leak?: {file, line} (the first leak's link must show it), processes?: N,
//         gpu?: {file, line, cells: [gpu, gpu mem]} (the line's GPU cells; the GPU charts
//         and flame graph drawn) }
//    or { smoke: [html, ...], chromium }: each page only loads cleanly.
// Prints one line "OK <json facts>" on success; on failure prints "FAIL: why" and exits 1.
"use strict";
const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const failures = [];
const fail = (m) => failures.push(m);
const facts = {};

(async () => {
  const browser = await chromium.launch({
    executablePath: spec.chromium,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    if (spec.smoke) {
      // Each page only loads, requests nothing else, logs no error and shows its header.
      for (const html of spec.smoke) {
        const page = await browser.newPage();
        const url = "file://" + path.resolve(html);
        const bad = [];
        page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") bad.push(`console ${m.type()}: ${m.text()}`); });
        page.on("pageerror", (e) => bad.push("page error: " + e.message));
        await page.route("**/*", (route) => {
          const u = route.request().url();
          if (u === url || decodeURI(u) === url) return route.continue();
          bad.push("request: " + u);
          return route.abort();
        });
        await page.goto(url, { waitUntil: "load" });
        await page.waitForSelector("#header", { timeout: 10000 }).catch(() => bad.push("no header drawn"));
        // Open every file and draw the flame graphs: their code runs too.
        await page.evaluate(() => { for (const d of document.querySelectorAll("details.file")) d.open = true; window.scrollTo(0, document.body.scrollHeight); });
        await page.waitForTimeout(300);
        facts[path.basename(html)] = await page.evaluate(() => document.querySelectorAll("tr").length + " rows");
        if (bad.length) fail(`${html}: ${bad.join("; ")}`);
        await page.close();
      }
      return;
    }
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const url = "file://" + path.resolve(spec.html);
    const errors = [];
    const requests = [];
    page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") errors.push(`console ${m.type()}: ${m.text()}`); });
    page.on("pageerror", (e) => errors.push("page error: " + e.message));
    // Every request is seen here; only the file itself is let through.
    await page.route("**/*", (route) => {
      const u = route.request().url();
      requests.push(u);
      if (u === url || decodeURI(u) === url) return route.continue();
      return route.abort();
    });
    const t0 = Date.now();
    await page.goto(url, { waitUntil: "load" });
    await page.waitForSelector("#header");
    facts.load_ms = Date.now() - t0;
    const others = requests.filter((u) => u !== url && decodeURI(u) !== url);
    if (others.length) fail("requests besides the file: " + others.join(", "));
    if (!requests.length) fail("not even the file was requested (route interception broken?)");

    // Sorting: the first file's table, by its Time Python column.
    const order = () => page.$$eval("#F0 table.lines tbody tr[data-line]", (rs) => rs.map((r) => +r.dataset.line));
    const before = await order();
    await page.click('#F0 table.lines th[data-key="py"] button');
    const after = await order();
    const py = await page.evaluate(() => {
      const m = new Map(window.scaleneReport.data.files[0].l.map((a) => [a[0], a[1]]));
      return [...document.querySelectorAll("#F0 table.lines tbody tr[data-line]")].map((r) => m.get(+r.dataset.line) || 0);
    });
    if (JSON.stringify(before) === JSON.stringify(after)) fail(`sorting by Time Python left the rows in line order: ${before}`);
    for (let i = 1; i < py.length; i++) if (py[i] > py[i - 1]) { fail(`rows not in descending Python time after sorting: ${py}`); break; }
    const sortMark = await page.getAttribute('#F0 table.lines th[data-key="py"]', "aria-sort");
    if (sortMark !== "descending") fail("sorted column not marked descending: " + sortMark);
    facts.sorted_rows = after.length;
    // Back to line order for the screenshot.
    await page.click('#F0 table.lines th[data-key="line"] button');

    // The hottest line: highlighted, with the JSON's split.
    if (spec.hottest) {
      const h = spec.hottest;
      const got = await page.evaluate((h) => {
        const fi = window.scaleneReport.data.files.findIndex((f) => f.n === h.file);
        const tr = document.getElementById(`L${fi}-${h.line}`);
        if (!tr) return null;
        return { cls: tr.className, cells: [...tr.querySelectorAll("td.bar")].slice(0, h.cells.length).map((td) => td.textContent), source: tr.querySelector("td.src").textContent };
      }, h);
      if (!got) fail(`hottest line ${h.file}:${h.line} has no row`);
      else {
        if (!got.cls.split(" ").includes("hot")) fail(`hottest line ${h.line} not highlighted (class "${got.cls}")`);
        if (h.source !== undefined && got.source !== h.source) fail(`hottest line ${h.line} shows source ${JSON.stringify(got.source)}, the JSON has ${JSON.stringify(h.source)}`);
        if (JSON.stringify(got.cells) !== JSON.stringify(h.cells)) fail(`hottest line ${h.line} shows ${JSON.stringify(got.cells)}, the JSON says ${JSON.stringify(h.cells)}`);
      }
      facts.hottest = got;
    }

    // A line's GPU cells, the GPU charts and the GPU flame graph.
    if (spec.gpu) {
      const g = spec.gpu;
      const got = await page.evaluate((g) => {
        const fi = window.scaleneReport.data.files.findIndex((f) => f.n === g.file);
        const tr = document.getElementById(`L${fi}-${g.line}`);
        if (!tr) return null;
        const cells = [...tr.querySelectorAll("td")];
        const i = cells.findIndex((td) => td.classList.contains("gp"));
        return {
          cells: i < 0 ? null : [cells[i].textContent, cells[i + 1].textContent],
          heads: [...document.querySelectorAll("#F0 table.lines th")].map((th) => th.textContent),
          charts: document.querySelectorAll("#gpu ~ svg.chart").length,
        };
      }, g);
      if (!got) fail(`GPU line ${g.file}:${g.line} has no row`);
      else {
        if (JSON.stringify(got.cells) !== JSON.stringify(g.cells)) fail(`GPU line ${g.line} shows ${JSON.stringify(got.cells)}, the JSON says ${JSON.stringify(g.cells)}`);
        if (got.charts < 2) fail(`${got.charts} GPU charts (utilization and memory expected)`);
      }
      await page.locator("#flame-gpu").scrollIntoViewIfNeeded().catch(() => fail("no GPU flame graph"));
      await page.waitForSelector("#flame-gpu ~ .fg-holder svg g", { timeout: 5000 }).catch(() => fail("the GPU flame graph drew nothing"));
      facts.gpu = got;
    }

    // --native: the row under a line naming its native functions.
    if (spec.native) {
      const n = spec.native;
      const got = await page.evaluate((n) => {
        const fi = window.scaleneReport.data.files.findIndex((f) => f.n === n.file);
        const tr = document.getElementById(`L${fi}-${n.line}`);
        if (!tr) return null;
        const next = tr.nextElementSibling;
        const rows = document.querySelectorAll(`#F${fi} tr.nf`).length;
        return { next: next && next.classList.contains("nf") ? next.textContent : null, rows, src: tr.querySelector("td.src").textContent };
      }, n);
      if (!got) fail(`native line ${n.file}:${n.line} has no row`);
      else {
        if (got.next !== n.text) fail(`the row under line ${n.line} reads ${JSON.stringify(got.next)}, expected ${JSON.stringify(n.text)}`);
        if (got.rows !== n.rows) fail(`${got.rows} native rows in the file, expected ${n.rows}`);
        if (got.src !== n.source) fail(`line ${n.line}'s source cell reads ${JSON.stringify(got.src)}`);
      }
      facts.native = got;
    }

    // Markup in the source shows as text once all lines are shown.
    if (spec.markup) {
      await page.check("#F0 input.all-lines");
      const m = await page.evaluate((text) => ({
        shown: [...document.querySelectorAll("td.src")].some((td) => td.textContent.includes(text)),
        injected: document.querySelectorAll("td.src *, img").length,
        title: document.title,
        rows: document.querySelectorAll("#F0 table.lines tbody tr[data-line]").length,
      }), spec.markup);
      if (!m.shown) fail(`the source text ${JSON.stringify(spec.markup)} is not shown as text`);
      if (m.injected) fail(`${m.injected} elements made from the profile's text`);
      if (m.title.includes("pwned")) fail("a script from the source ran: " + m.title);
      facts.all_lines_rows = m.rows;
    }

    // A likely leak's link opens its file (built on demand) at its line.
    if (spec.leak) {
      await page.click("#leaks-table a");
      const l = await page.evaluate((lk) => {
        const fi = window.scaleneReport.data.files.findIndex((f) => f.n === lk.file);
        const tr = document.getElementById(`L${fi}-${lk.line}`);
        const r = tr && tr.getBoundingClientRect();
        return { open: document.getElementById("F" + fi).open, row: !!tr, visible: !!r && r.top >= 0 && r.bottom <= window.innerHeight };
      }, spec.leak);
      if (!l.open || !l.row || !l.visible) fail(`the leak's link did not show ${spec.leak.file}:${spec.leak.line}: ${JSON.stringify(l)}`);
      facts.leak = l;
      const procs = await page.$$eval("#processes-table tbody tr", (rs) => rs.length);
      if (spec.processes !== undefined && procs !== spec.processes) fail(`${procs} process rows, expected ${spec.processes}`);
    }

    // The time flame graph: clicking a frame zooms to it.
    await page.locator("#flame-time").scrollIntoViewIfNeeded();
    await page.waitForSelector("#flame-time ~ .fg-holder svg g", { timeout: 5000 }).catch(() => fail("the time flame graph drew nothing"));
    const target = await page.evaluate(() => {
      const holder = document.querySelector("#flame-time ~ .fg-holder");
      const W = +holder.querySelector("svg").getAttribute("width");
      const gs = [...holder.querySelectorAll("g")].filter((g) => +g.dataset.i > 0);
      const narrow = gs.find((g) => { const w = +g.querySelector("rect").getAttribute("width"); return w < W * 0.9 && w > 20; }) || gs[gs.length - 1];
      return narrow ? { i: narrow.dataset.i, w: +narrow.querySelector("rect").getAttribute("width"), W } : null;
    });
    if (!target) fail("no frame to click in the time flame graph");
    else {
      await page.click(`#flame-time ~ .fg-holder g[data-i="${target.i}"]`);
      const z = await page.evaluate((i) => {
        const holder = document.querySelector("#flame-time ~ .fg-holder");
        const g = holder.querySelector(`g[data-i="${i}"]`);
        return { zoom: holder.dataset.zoom, w: g ? +g.querySelector("rect").getAttribute("width") : -1, W: +holder.querySelector("svg").getAttribute("width") };
      }, target.i);
      if (z.zoom !== target.i) fail(`clicking frame ${target.i} zoomed to ${z.zoom}`);
      if (!(z.w > target.w && z.w >= z.W * 0.95)) fail(`the clicked frame is ${z.w}px wide after zooming (was ${target.w}px of ${z.W})`);
      facts.zoom = { frame: target.i, before_px: target.w, after_px: z.w };
      await page.click("#flame-time ~ .fg-bar .fg-reset");
      // Searching for the clicked frame's function highlights it and says its share.
      const name = await page.evaluate((i) => {
        const g = document.querySelector(`#flame-time ~ .fg-holder g[data-i="${i}"]`);
        return g.querySelector("title").textContent.split(" (")[0];
      }, target.i);
      await page.fill("#flame-time ~ .fg-bar input", name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
      const found = await page.evaluate(() => ({
        matches: document.querySelectorAll("#flame-time ~ .fg-holder g.match").length,
        info: document.querySelector("#flame-time ~ .fg-info").textContent,
      }));
      if (!found.matches || !found.info.startsWith("Matched")) fail(`searching for ${name} found ${JSON.stringify(found)}`);
      facts.search = { name, ...found };
      await page.fill("#flame-time ~ .fg-bar input", "");
    }
    if (spec.screenshot_at) {
      // One screen from the given element down (a big report's full page is huge).
      await page.locator(spec.screenshot_at).scrollIntoViewIfNeeded();
      await page.evaluate((sel) => document.querySelector(sel).scrollIntoView(), spec.screenshot_at);
      await page.screenshot({ path: spec.screenshot });
    } else if (spec.screenshot) {
      await page.evaluate(() => window.scrollTo(0, 0));
      await page.screenshot({ path: spec.screenshot, fullPage: true });
    }
    if (errors.length) fail(errors.join("; "));
  } finally {
    await browser.close();
  }
})().then(() => {
  if (failures.length) {
    console.log("FAIL: " + failures.join("\nFAIL: "));
    process.exit(1);
  }
  console.log("OK " + JSON.stringify(facts));
}).catch((e) => {
  console.log("FAIL: " + (e && e.stack ? e.stack : e));
  process.exit(1);
});
