// The ZeroShard dashboard: a single-page app over the coordinator's /api/v1 JSON (hash routes
// #/cluster, #/jobs, #/jobs/<id>, #/compare?jobs=a,b), polling the live views.
(function () {
  "use strict";

  const POLL_MS = 1500;
  const EVENT_PAGE = 1000;
  // A poll reads at most this many pages of events, so a fast job cannot stall the page.
  const EVENT_PAGES_PER_POLL = 10;
  const STEP_BARS = 60;
  const JOB_PAGES = 2;
  const MAX_BUCKETS_DRAWN = 64;
  const MEMORY_CATEGORIES = [
    ["paramsBytes", "params"],
    ["gradsBytes", "grads"],
    ["masterBytes", "master"],
    ["optimizerStateBytes", "optimizer state"],
    ["bucketBytes", "buckets"],
    ["commScratchBytes", "comm scratch"],
    ["gatherPoolBytes", "gather pool (zero3)"],
    ["commStagingBytes", "comm staging"],
    ["workloadBytes", "workload"],
    ["kernelTablesBytes", "kernel tables"],
    ["checkpointStagingBytes", "checkpoint staging"],
  ];
  const STEP_PARTS = [
    ["computeMs", "compute (fwd+bwd)"],
    ["exposedCommMs", "exposed communication"],
    ["updateMs", "update"],
    ["allgatherMs", "all-gather issue"],
    ["paramWaitMs", "param wait"],
  ];
  const DTYPE_BYTES = { FLOAT32: 4, BFLOAT16: 2, FLOAT16: 2, FLOAT64: 8 };
  const ENDED = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

  const C = window.ZsChart;
  const main = document.getElementById("main");
  let current = null; // the page on screen: {stop()}

  // ---- helpers -------------------------------------------------------------------------------

  function num(value) {
    const n = Number(value);
    return isFinite(n) ? n : 0;
  }

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null) continue;
      node.appendChild(typeof child === "string" || typeof child === "number"
        ? document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function parseTime(value) {
    if (!value) return null;
    // Proto JSON timestamps carry up to 9 fractional digits; Date.parse wants at most 3.
    const ms = Date.parse(String(value).replace(/(\.\d{3})\d+/, "$1"));
    return isNaN(ms) ? null : ms;
  }

  function age(value) {
    const ms = parseTime(value);
    if (ms === null) return "\u2014";
    const s = Math.max(0, (Date.now() - ms) / 1000);
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function timeOf(value) {
    const ms = parseTime(value);
    return ms === null ? "\u2014" : new Date(ms).toLocaleTimeString();
  }

  function ms(value) {
    return num(value).toFixed(2) + " ms";
  }

  // Proto JSON prints an unset enum as its *_UNSPECIFIED name: treat it as absent.
  function enumName(value) {
    return value && !/_UNSPECIFIED$/.test(value) ? value : "";
  }

  function stateBadge(state) {
    state = enumName(state);
    return h("span", { class: "badge state-" + String(state || "unknown").toLowerCase() }, state || "\u2014");
  }

  function jobLink(id) {
    return id ? h("a", { href: "#/jobs/" + encodeURIComponent(id) }, id) : "\u2014";
  }

  function modeName(job) {
    return enumName(job.spec && job.spec.mode) || "\u2014";
  }

  function workloadName(job) {
    const workload = (job.spec && job.spec.workload) || {};
    if (workload.preset) return workload.preset;
    if (workload.attached && workload.attached.tensors && workload.attached.tensors.length) {
      return workload.attached.tensors.length + " tensors (attached)";
    }
    if (workload.layerSizes && workload.layerSizes.length) return "MLP " + workload.layerSizes.join("-");
    return "\u2014";
  }

  function worldSize(job) {
    if (job.workerIds && job.workerIds.length) return job.workerIds.length;
    const spec = job.spec || {};
    return num(spec.minWorkers) || num(spec.maxWorkers) || 0;
  }

  class HttpError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const response = await fetch("/api/v1/" + path, {
      credentials: "same-origin", headers: { Accept: "application/json" },
    });
    if (response.status === 401) {
      window.location.assign("/login");
      throw new HttpError(401, "UNAUTHENTICATED", "not logged in");
    }
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      const error = (body && body.error) || {};
      throw new HttpError(response.status, error.code || String(response.status),
        error.message || response.statusText);
    }
    return body || {};
  }

  // Up to `maxPages` pages of a listing; `more` says whether the listing went on.
  async function listPages(path, key, maxPages) {
    const items = [];
    let token = "";
    for (let page = 0; page < maxPages; page++) {
      const query = "?pageSize=500" + (token ? "&pageToken=" + encodeURIComponent(token) : "");
      const body = await api(path + query);
      items.push(...(body[key] || []));
      token = body.nextPageToken || "";
      if (!token) break;
    }
    items.more = Boolean(token);
    return items;
  }

  // Follows a job's events: fetches those after the last sequence it has.
  class EventFollower {
    constructor(jobId) {
      this.jobId = jobId;
      this.after = 0;
      this.events = [];
    }
    async poll() {
      for (let page = 0; page < EVENT_PAGES_PER_POLL; page++) {
        const body = await api("jobs/" + encodeURIComponent(this.jobId) + "/events?afterSequence=" +
          this.after + "&limit=" + EVENT_PAGE);
        const events = body.events || [];
        for (const event of events) {
          this.events.push(event);
          this.after = Math.max(this.after, num(event.sequence));
        }
        if (events.length < EVENT_PAGE) return true;
      }
      return false;
    }
    // One entry per reported step (a later report of a step, after a restart, replaces it).
    progress() {
      const byStep = new Map();
      for (const event of this.events) {
        if (event.type === "PROGRESS" && event.progress) byStep.set(num(event.progress.step), event);
      }
      return [...byStep.entries()].sort((a, b) => a[0] - b[0]).map(([, event]) => event);
    }
  }

  // Runs `tick` now and every POLL_MS while `live()` holds; errors go to the page's banner.
  function poller(root, tick, live) {
    let timer = null;
    let stopped = false;
    const banner = h("div", { class: "banner", hidden: true });
    root.prepend(banner);
    async function run() {
      if (stopped) return;
      try {
        await tick();
        banner.hidden = true;
      } catch (e) {
        banner.hidden = false;
        banner.textContent = "Could not load: " + (e.code ? e.code + ": " : "") + e.message;
      }
      if (!stopped && live()) timer = setTimeout(run, POLL_MS);
    }
    run();
    return {
      stop() {
        stopped = true;
        if (timer !== null) clearTimeout(timer);
      },
    };
  }

  function table(headers, rows, attrs) {
    return h("table", attrs || {},
      h("thead", {}, h("tr", {}, headers.map((header) => h("th", {}, header)))),
      h("tbody", {}, rows.length
        ? rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell))))
        : h("tr", {}, h("td", { colspan: headers.length, class: "empty" }, "none"))));
  }

  function replace(container, ...children) {
    container.replaceChildren(...children.flat().filter((c) => c));
  }

  function pageRoot(name, title) {
    const root = h("section", { "data-page": name, class: "page" }, h("h1", {}, title));
    main.replaceChildren(root);
    return root;
  }

  // ---- memory: measured categories and the ZeRO formula --------------------------------------

  // The ZeRO paper's per-rank model-state bytes (docs/design.md, README's "ZeRO formula"), as the
  // plan serves them (ShardPlan.modelStateFormula, computed by the coordinator): the parameters in
  // full (sharded in zero3), the gradients sharded from zero2, fp32 master copies (non-fp32
  // parameters only) and K fp32 optimizer-state copies sharded from zero1, all over W; zero3 adds
  // its gather pool. Null without a plan.
  function zeroFormula(job, plan) {
    const f = plan && plan.modelStateFormula;
    if (!f || !num(f.parameters)) return null;
    const mode = enumName(job.spec && job.spec.mode) || "DDP";
    const w = Math.max(1, num(plan.worldSize) || worldSize(job));
    const shardsState = mode !== "DDP";
    const shardsGrads = mode === "ZERO2" || mode === "ZERO3";
    const shardsParams = mode === "ZERO3";
    const parts = {
      paramsBytes: num(f.paramsBytes),
      gradsBytes: num(f.gradsBytes),
      masterBytes: num(f.masterBytes),
      optimizerStateBytes: num(f.optimizerStateBytes),
      gatherPoolBytes: num(f.gatherPoolBytes),
    };
    const k = num(f.optimizerStateCopies);
    const total = parts.paramsBytes + parts.gradsBytes + parts.masterBytes + parts.optimizerStateBytes +
      parts.gatherPoolBytes;
    const text = "\u03a8\u00b7(" + num(f.paramBytes) + (shardsParams ? "/W" : "") + " + " + num(f.gradBytes) +
      (shardsGrads ? "/W" : "") + (parts.masterBytes ? " + 4" + (shardsState ? "/W" : "") : "") + " + " + k +
      "\u00b74" + (shardsState ? "/W" : "") + ")" +
      (shardsParams ? " + pool (" + C.formatBytes(parts.gatherPoolBytes) + ")" : "");
    return { total: Math.round(total), parts: parts, text: text, w: w, k: k, psi: num(f.parameters) };
  }

  function rankMetrics(job) {
    const ranks = job.rankProgress && job.rankProgress.length ? job.rankProgress : null;
    if (ranks) return ranks.map((metrics, rank) => ({ rank: rank, metrics: metrics || {} }));
    // A coordinator without per-rank progress: rank 0's latest report is all there is.
    return job.progress && job.progress.memory ? [{ rank: 0, metrics: job.progress }] : [];
  }

  function memoryBars(entries, formulaFor) {
    return entries.map((entry) => {
      const memory = entry.metrics.memory || null;
      const segments = memory ? MEMORY_CATEGORIES.map(([key, label], i) => ({
        value: num(memory[key]),
        color: C.color(i),
        title: entry.label + " " + label + ": " + C.formatBytes(memory[key]),
        attrs: { "data-rank": entry.rank, "data-category": key, "data-bytes": num(memory[key]), "data-job": entry.jobId },
      })) : [];
      const formula = formulaFor(entry);
      const markers = formula ? [{
        value: formula.total, color: "#000",
        title: "ZeRO formula " + formula.text + " = " + C.formatBytes(formula.total),
        attrs: { "data-formula-bytes": formula.total },
      }] : [];
      return { label: entry.label, segments: segments, markers: markers };
    });
  }

  // zero3's gather pool holds the parameters in use, so the formula counts it with the model states.
  const MODEL_STATE_CATEGORIES = new Set(["paramsBytes", "gradsBytes", "masterBytes", "optimizerStateBytes",
    "gatherPoolBytes"]);

  // The same bars cut to the categories the ZeRO formula counts, so that the formula marker is
  // legible beside buffers (communication staging) that can dwarf a small model.
  function modelStateBars(bars) {
    return bars.map((bar) => ({
      label: bar.label, markers: bar.markers,
      segments: bar.segments.filter((s) => MODEL_STATE_CATEGORIES.has(s.attrs["data-category"]))
        .map((s) => Object.assign({}, s, { attrs: { "data-model-state": s.attrs["data-category"] } })),
    }));
  }

  function memoryCharts(container, bars, opts) {
    container.append(h("h3", {}, "Every counted category"),
      memoryChart(bars, opts),
      h("h3", {}, "Model states against the ZeRO formula"),
      C.stackedBars(modelStateBars(bars), Object.assign({
        chart: "memory-model-states", format: C.formatBytes, bytes: true, yLabel: "bytes", height: 240,
        emptyText: "no rank has reported its memory yet",
      }, opts || {})));
    memoryLegend(container);
  }

  function memoryChart(bars, opts) {
    return C.stackedBars(bars, Object.assign({
      chart: "memory", format: C.formatBytes, bytes: true, yLabel: "bytes", height: 280,
      emptyText: "no rank has reported its memory yet",
    }, opts || {}));
  }

  function memoryLegend(container) {
    C.legend(container, MEMORY_CATEGORIES.map(([, label], i) => ({ label: label, color: C.color(i) }))
      .concat([{ label: "ZeRO formula (params + grads + master + optimizer state, + gather pool in zero3)", color: "#000", dashed: true }]));
  }

  // ---- pages -------------------------------------------------------------------------------

  function clusterPage() {
    const root = pageRoot("cluster", "Cluster");
    const summary = h("p", { class: "summary" });
    const body = h("div");
    root.append(summary, body);
    return poller(root, async () => {
      const workers = await listPages("workers", "workers", 20);
      const counts = {};
      for (const worker of workers) counts[worker.state] = (counts[worker.state] || 0) + 1;
      summary.textContent = workers.length + " workers" + (workers.length ? ": " +
        Object.entries(counts).map(([state, n]) => n + " " + state).join(", ") : "");
      const rows = workers.map((worker) => {
        const assignment = worker.assignment || {};
        const running = assignment.kind === "ASSIGNMENT_RUN" && assignment.jobId;
        const labels = Object.entries(worker.labels || {}).map(([k, v]) => k + "=" + v).join(", ");
        const device = (enumName(worker.deviceKind) || "\u2014") +
          (num(worker.deviceMemoryBytes) ? " (" + C.formatBytes(worker.deviceMemoryBytes) + ")" : "");
        return [
          h("span", { "data-worker": worker.id }, worker.name || worker.id, worker.name && worker.name !== worker.id ? h("small", {}, " " + worker.id) : null),
          stateBadge(worker.state), worker.host || "\u2014", device, labels || "\u2014",
          age(worker.lastHeartbeatTime),
          running ? jobLink(assignment.jobId) : "\u2014",
          running ? num(assignment.rank) + " / " + num(assignment.worldSize) : "\u2014",
        ];
      });
      replace(body, table(["worker", "state", "host", "device", "labels", "last heartbeat", "job", "rank / W"], rows));
      root.setAttribute("data-ready", "true");
    }, () => true);
  }

  function jobsPage() {
    const root = pageRoot("jobs", "Jobs");
    const compareBar = h("p", { class: "compare-bar" });
    const compareLink = h("a", { href: "#/compare", class: "button" }, "Compare selected");
    const hint = h("span", { class: "hint" }, " pick 2\u20134 jobs");
    compareBar.append(compareLink, hint);
    const body = h("div");
    root.append(compareBar, body);
    const selected = new Set();
    function updateCompare() {
      const ids = [...selected];
      compareLink.setAttribute("href", "#/compare?jobs=" + ids.map(encodeURIComponent).join(","));
      compareLink.classList.toggle("disabled", ids.length < 2 || ids.length > 4);
    }
    updateCompare();
    return poller(root, async () => {
      // Newest first: a poll reads the newest JOB_PAGES pages, not a long history.
      const jobs = await listPages("jobs", "jobs", JOB_PAGES);
      const rows = jobs.map((job) => {
        const box = h("input", { type: "checkbox", "aria-label": "compare " + job.id });
        box.checked = selected.has(job.id);
        box.addEventListener("change", () => {
          if (box.checked) selected.add(job.id);
          else selected.delete(job.id);
          updateCompare();
        });
        const steps = num(job.spec && job.spec.steps);
        const step = num(job.progress && job.progress.step);
        return [
          box, h("span", { "data-job": job.id }, jobLink(job.id)), (job.spec && job.spec.name) || "\u2014",
          stateBadge(job.state), modeName(job), workloadName(job), String(worldSize(job) || "\u2014"),
          step + " / " + (steps || "\u2014"), age(job.createTime),
        ];
      });
      replace(body, table(["", "job", "name", "state", "mode", "workload", "W", "step / steps", "age"], rows),
        jobs.more ? h("p", { class: "hint" }, "The newest " + jobs.length + " jobs; older ones are in the API (/api/v1/jobs?pageToken=...).") : null);
      root.setAttribute("data-ready", "true");
    }, () => true);
  }

  function lossSeries(progressEvents, name, color) {
    return {
      name: name, color: color,
      points: progressEvents.map((event) => ({
        x: num(event.progress.step), y: num(event.progress.loss),
        attrs: { "data-point": num(event.progress.step) },
      })),
    };
  }

  function stepTimeChart(progressEvents) {
    const recent = progressEvents.slice(-STEP_BARS);
    const bars = recent.map((event) => {
      const p = event.progress;
      const parts = STEP_PARTS.map(([key, label], i) => ({
        value: num(p[key]), color: C.color(i), title: "step " + num(p.step) + " " + label + ": " + ms(p[key]),
        attrs: { "data-step": num(p.step), "data-part": key },
      }));
      const counted = parts.reduce((sum, part) => sum + part.value, 0);
      const other = Math.max(0, num(p.iterationMs) - counted);
      parts.push({ value: other, color: "#cccccc", title: "step " + num(p.step) + " other: " + ms(other), attrs: { "data-part": "other" } });
      return {
        label: String(num(p.step)), segments: parts,
        markers: num(p.iterationMs) ? [{ value: num(p.iterationMs), color: "#000", title: "iteration " + ms(p.iterationMs) }] : [],
      };
    });
    return C.stackedBars(bars, {
      chart: "step-time", yLabel: "ms", xLabel: "step (latest " + STEP_BARS + ")",
      format: (v) => C.formatNumber(v), emptyText: "no step reported yet", maxBarWidth: 24,
    });
  }

  function eventRows(events) {
    return events.filter((event) => event.type !== "PROGRESS").map((event) => {
      let detail = event.message || "";
      if (event.type === "GENERATION_STARTED") {
        detail = "W = " + (event.workerIds || []).length + ": " + (event.workerIds || []).join(", ") + (detail ? " \u2014 " + detail : "");
      } else if (event.type === "CHECKPOINT_COMMITTED" && event.checkpoint) {
        detail = "step " + num(event.checkpoint.step) + " at W = " + num(event.checkpoint.worldSize) +
          (event.checkpoint.manifestPath ? " (" + event.checkpoint.manifestPath + ")" : "");
      }
      const kind = event.type === "STATE_CHANGED" && (event.state === "RECOVERING" || event.state === "FAILED")
        ? "fault" : event.type === "NOTICE" ? "notice" : "";
      return [String(num(event.sequence)), timeOf(event.time), h("span", { class: "event " + kind }, event.type || "\u2014"),
        String(num(event.generation)), enumName(event.state) ? stateBadge(event.state) : "\u2014", detail || "\u2014"];
    });
  }

  function generationRows(events) {
    const generations = new Map();
    for (const event of events) {
      const g = num(event.generation);
      if (!g) continue;
      if (!generations.has(g)) generations.set(g, { started: null, workers: [], faults: 0, checkpoints: 0, lastStep: 0 });
      const info = generations.get(g);
      if (event.type === "GENERATION_STARTED") {
        info.started = event.time;
        info.workers = event.workerIds || [];
      } else if (event.type === "CHECKPOINT_COMMITTED") {
        info.checkpoints++;
      } else if (event.type === "STATE_CHANGED" && (event.state === "RECOVERING" || event.state === "FAILED")) {
        info.faults++;
      } else if (event.type === "PROGRESS" && event.progress) {
        info.lastStep = Math.max(info.lastStep, num(event.progress.step));
      }
    }
    return [...generations.entries()].map(([g, info]) => [String(g), timeOf(info.started),
      String(info.workers.length || "\u2014"), info.workers.join(", ") || "\u2014", String(info.lastStep),
      String(info.checkpoints), String(info.faults)]);
  }

  // Owned bytes per rank: rank r owns piece r (piece_elems elements) of every bucket.
  function shardMap(job, plan) {
    const container = h("div", { "data-chart": "shard-map", class: "shard-map" });
    const w = num(plan.worldSize) || worldSize(job);
    const precision = (job.spec && job.spec.precision) || {};
    const elemBytes = DTYPE_BYTES[precision.paramDtype] || 4;
    const buckets = plan.buckets || [];
    const perRank = new Array(w).fill(0);
    if (buckets.length) {
      for (const bucket of buckets) for (let r = 0; r < w; r++) perRank[r] += num(bucket.pieceElems) * elemBytes;
    } else {
      for (let r = 0; r < w; r++) perRank[r] = (num(plan.totalElems) / Math.max(1, w)) * elemBytes;
    }
    const total = num(plan.totalElems) * elemBytes;
    container.append(h("p", { class: "summary" },
      "W = " + w + ", " + num(plan.bucketCount || buckets.length) + " buckets of up to " +
      num(plan.bucketElems).toLocaleString() + " elements, " + num(plan.tensorCount) + " tensors; " +
      num(plan.modelElems).toLocaleString() + " model elements in " + num(plan.totalElems).toLocaleString() +
      " padded slots (" + C.formatBytes(total) + " at " + elemBytes + " B each); plan generation " + num(plan.generation) + "."));
    container.append(C.segmentedBar(perRank.map((bytes, r) => ({
      value: bytes, color: C.color(r), label: "rank " + r,
      title: "rank " + r + " owns " + C.formatBytes(bytes),
      attrs: { "data-rank": r, "data-bytes": bytes },
    })), { width: 640, height: 48, caption: "" }));
    C.legend(container, perRank.map((bytes, r) => ({ label: "rank " + r + ": " + C.formatBytes(bytes), color: C.color(r) })));
    const drawn = buckets.slice(0, MAX_BUCKETS_DRAWN);
    const list = h("div", { class: "buckets" });
    for (const bucket of drawn) {
      const pieces = [];
      for (let r = 0; r < w; r++) {
        pieces.push({
          value: num(bucket.pieceElems), color: C.color(r), label: "r" + r,
          title: "bucket " + num(bucket.index) + ", rank " + r + ": elements [" +
            (num(bucket.flatBegin) + r * num(bucket.pieceElems)) + ", " +
            (num(bucket.flatBegin) + (r + 1) * num(bucket.pieceElems)) + ")",
          attrs: { "data-owner": r, "data-bucket": num(bucket.index) },
        });
      }
      list.append(h("div", { class: "bucket-row" },
        h("span", { class: "bucket-label" }, "bucket " + num(bucket.index) + " \u00b7 " +
          num(bucket.tensorCount) + " tensors \u00b7 " + num(bucket.tensorElems).toLocaleString() + " / " +
          num(bucket.paddedElems).toLocaleString() + " elements"),
        C.segmentedBar(pieces, { width: 640, height: 32, margin: { top: 4, right: 8, bottom: 4, left: 8 } })));
    }
    if (buckets.length > drawn.length) list.append(h("p", { class: "hint" }, (buckets.length - drawn.length) + " more buckets not drawn"));
    container.append(list);
    return container;
  }

  function jobPage(jobId) {
    const root = pageRoot("job", "Job " + jobId);
    const header = h("div", { class: "job-header" });
    const lossBox = h("div", { class: "panel" });
    const stepBox = h("div", { class: "panel" });
    const memoryBox = h("div", { class: "panel" });
    const shardBox = h("div", { class: "panel" });
    const generationBox = h("div", { class: "panel" });
    const eventBox = h("div", { class: "panel" });
    root.append(header,
      h("h2", {}, "Loss"), lossBox,
      h("h2", {}, "Step time"), stepBox,
      h("h2", {}, "Memory per rank"), memoryBox,
      h("h2", {}, "Shard map"), shardBox,
      h("h2", {}, "Generations"), generationBox,
      h("h2", {}, "Events"), eventBox);
    const follower = new EventFollower(jobId);
    let job = null;
    let plan = null;
    let planGeneration = ""; // the generation (and whether ended) of `plan`
    let planNote = "";
    let renderedEvents = -1;
    let caughtUp = false;
    return poller(root, async () => {
      job = await api("jobs/" + encodeURIComponent(jobId));
      caughtUp = await follower.poll();
      // The plan is served while a generation runs and, for an ended job, as its last generation's
      // (asked for again once the job ends: a generation may end between two polls).
      const ended = ENDED.has(job.state);
      const hasPlan = job.state === "RUNNING" ||
        (ended && num(job.generation) > 0 && (job.workerIds || []).length > 0);
      const planKey = num(job.generation) + (ended ? ":ended" : "");
      if (hasPlan && planKey !== planGeneration) {
        const planPath = "jobs/" + encodeURIComponent(jobId) + "/plan";
        try {
          plan = await api(planPath + "?includeLayout=true");
          planGeneration = planKey;
          planNote = "";
        } catch (layoutError) {
          // A layout too large for one reply: the totals without the buckets.
          try {
            plan = await api(planPath);
            planGeneration = planKey;
            planNote = "Buckets not shown: " + layoutError.message;
          } catch (e) {
            planNote = "The shard plan is not available: " + e.message;
          }
        }
      } else if (!plan && !hasPlan) {
        planNote = "No shard plan yet: the job has not run (state " + job.state + ").";
      }
      renderHeader();
      if (follower.events.length !== renderedEvents) {
        renderedEvents = follower.events.length;
        renderProgress();
      }
      renderMemory();
      replace(shardBox, plan ? shardMap(job, plan) : null, planNote ? h("p", { class: "hint" }, planNote) : null);
      if (caughtUp) root.setAttribute("data-ready", "true");
    }, () => !job || !ENDED.has(job.state) || !caughtUp);

    function renderHeader() {
      const spec = job.spec || {};
      const optimizer = spec.optimizer || {};
      const steps = num(spec.steps);
      const step = num(job.progress && job.progress.step);
      replace(header, h("dl", { class: "facts" },
        h("dt", {}, "state"), h("dd", {}, stateBadge(job.state)),
        h("dt", {}, "name"), h("dd", {}, spec.name || "\u2014"),
        h("dt", {}, "mode"), h("dd", {}, modeName(job)),
        h("dt", {}, "workload"), h("dd", {}, workloadName(job)),
        h("dt", {}, "optimizer"), h("dd", {}, (optimizer.kind || "\u2014") + (optimizer.lr !== undefined ? " lr " + optimizer.lr : "")),
        h("dt", {}, "W"), h("dd", {}, String(worldSize(job) || "\u2014")),
        h("dt", {}, "step"), h("dd", {}, step + " / " + (steps || "\u2014")),
        h("dt", {}, "generation"), h("dd", {}, String(num(job.generation))),
        h("dt", {}, "attempts"), h("dd", {}, String(num(job.attempts))),
        h("dt", {}, "created"), h("dd", {}, age(job.createTime) + " ago"),
        h("dt", {}, "latest checkpoint"), h("dd", {}, job.latestCheckpoint && num(job.latestCheckpoint.step) ? "step " + num(job.latestCheckpoint.step) : "\u2014"),
        job.message ? [h("dt", {}, "message"), h("dd", {}, job.message)] : null));
    }

    function renderProgress() {
      const progress = follower.progress();
      replace(lossBox, C.lineChart([lossSeries(progress, jobId, C.color(0))], {
        chart: "loss", xLabel: "step", yLabel: "loss", emptyText: "no step reported yet",
      }), h("p", { class: "hint" }, progress.length + " steps reported" +
        (progress.length ? ", latest loss " + C.formatNumber(num(progress[progress.length - 1].progress.loss)) : "")));
      replace(stepBox, stepTimeChart(progress));
      C.legend(stepBox, STEP_PARTS.map(([, label], i) => ({ label: label, color: C.color(i) }))
        .concat([{ label: "other", color: "#cccccc" }, { label: "iteration", color: "#000", dashed: true }]));
      stepBox.append(h("p", { class: "hint" }, "Param wait's forward part is inside compute; the bars can exceed the iteration by that overlap."));
      replace(generationBox, table(["generation", "started", "W", "workers", "last step", "checkpoints", "faults"], generationRows(follower.events)));
      replace(eventBox, table(["#", "time", "type", "generation", "state", "detail"], eventRows(follower.events), { class: "events" }));
    }

    function renderMemory() {
      const entries = rankMetrics(job).map((entry) => Object.assign(entry, { label: "rank " + entry.rank, jobId: jobId }));
      const reported = entries.filter((entry) => entry.metrics.memory);
      const formula = zeroFormula(job, plan);
      const bars = memoryBars(reported, () => formula);
      const rssRows = entries.map((entry) => {
        const m = entry.metrics;
        return [entry.label, m.memory ? String(num(m.step)) : "not reported yet",
          m.memory ? C.formatBytes(m.memory.totalBytes) : "\u2014",
          formula ? C.formatBytes(formula.total) : "\u2014",
          num(m.vmhwmBytes) ? h("span", { "data-rank": entry.rank, "data-vmhwm-bytes": num(m.vmhwmBytes) }, C.formatBytes(m.vmhwmBytes)) : "\u2014",
          num(m.vmrssAtStartBytes) ? C.formatBytes(m.vmrssAtStartBytes) : "\u2014"];
      });
      replace(memoryBox);
      memoryCharts(memoryBox, bars, { xLabel: "rank" });
      memoryBox.append(h("p", { class: "hint" }, formula
        ? "ZeRO formula for " + modeName(job) + " at W = " + formula.w + ", \u03a8 = " + formula.psi.toLocaleString() +
          " (the plan's model elements): " + formula.text + " = " + C.formatBytes(formula.total) + " per rank."
        : "The ZeRO formula comes with the shard plan, which is not available."));
      memoryBox.append(h("div", { class: "rss" }, table(["rank", "at step", "counted total", "ZeRO formula", "peak RSS (VmHWM)", "RSS at start"], rssRows)));
    }
  }

  // The plan of a job that has run (its running generation's, or an ended job's last), without
  // the layout; null when there is none.
  async function planOf(id, job) {
    const ended = ENDED.has(job.state);
    if (job.state !== "RUNNING" && !(ended && num(job.generation) > 0 && (job.workerIds || []).length > 0)) return null;
    try {
      return await api("jobs/" + encodeURIComponent(id) + "/plan");
    } catch (e) {
      return null;
    }
  }

  function comparePage(query) {
    const root = pageRoot("compare", "Compare");
    const ids = (new URLSearchParams(query).get("jobs") || "").split(",").map((s) => s.trim()).filter((s) => s);
    const picker = h("div", { class: "picker" });
    const lossBox = h("div", { class: "panel" });
    const memoryBox = h("div", { class: "panel" });
    const tableBox = h("div", { class: "panel" });
    root.append(picker, h("h2", {}, "Loss"), lossBox, h("h2", {}, "Memory per rank"), memoryBox, tableBox);
    const followers = new Map(ids.map((id) => [id, new EventFollower(id)]));
    let jobs = new Map();
    let allCaughtUp = false;
    let pickerDrawn = false;

    async function drawPicker() {
      const list = await listPages("jobs", "jobs", JOB_PAGES);
      const chosen = new Set(ids);
      const link = h("a", { class: "button", href: "#/compare?jobs=" + ids.join(",") }, "Compare");
      const boxes = list.map((job) => {
        const box = h("input", { type: "checkbox", value: job.id });
        box.checked = chosen.has(job.id);
        box.addEventListener("change", () => {
          if (box.checked) chosen.add(job.id);
          else chosen.delete(job.id);
          link.setAttribute("href", "#/compare?jobs=" + [...chosen].map(encodeURIComponent).join(","));
          link.classList.toggle("disabled", chosen.size < 2 || chosen.size > 4);
        });
        return h("label", { class: "pick" }, box, " " + job.id + " (" + modeName(job) + ", " + workloadName(job) + ", " + job.state + ")");
      });
      link.classList.toggle("disabled", chosen.size < 2 || chosen.size > 4);
      replace(picker, h("p", {}, "Pick 2\u20134 jobs: "), h("div", { class: "picks" }, boxes), link);
    }

    return poller(root, async () => {
      if (!pickerDrawn) {
        await drawPicker();
        pickerDrawn = true;
      }
      if (ids.length < 2 || ids.length > 4) {
        replace(lossBox, h("p", { class: "hint" }, "Choose between 2 and 4 jobs to compare (" + ids.length + " chosen)."));
        replace(memoryBox);
        root.setAttribute("data-ready", "true");
        return;
      }
      allCaughtUp = true;
      const fetched = new Map();
      for (const id of ids) {
        fetched.set(id, await api("jobs/" + encodeURIComponent(id)));
        allCaughtUp = (await followers.get(id).poll()) && allCaughtUp;
      }
      jobs = fetched;
      const series = ids.map((id, i) => lossSeries(followers.get(id).progress(), id + " " + modeName(jobs.get(id)), C.color(i)));
      replace(lossBox, C.lineChart(series, { chart: "loss", xLabel: "step", yLabel: "loss", width: 720 }));
      C.legend(lossBox, series.map((s, i) => ({ label: s.name, color: C.color(i) })));
      const entries = [];
      const formulas = new Map();
      for (const id of ids) {
        const job = jobs.get(id);
        const reported = rankMetrics(job).filter((entry) => entry.metrics.memory);
        formulas.set(id, zeroFormula(job, await planOf(id, job)));
        for (const entry of reported) entries.push(Object.assign(entry, { label: modeName(job) + " " + id.replace(/^job-0*/, "#") + " r" + entry.rank, jobId: id }));
      }
      replace(memoryBox);
      memoryCharts(memoryBox, memoryBars(entries, (entry) => formulas.get(entry.jobId)),
        { width: 720, rotateLabels: true, xLabel: "" });
      const rows = ids.map((id) => {
        const job = jobs.get(id);
        const progress = followers.get(id).progress();
        const last = progress.length ? progress[progress.length - 1].progress : {};
        const iterations = progress.map((event) => num(event.progress.iterationMs)).filter((v) => v > 0).sort((a, b) => a - b);
        const median = iterations.length ? iterations[Math.floor(iterations.length / 2)] : 0;
        const reported = rankMetrics(job).filter((entry) => entry.metrics.memory);
        const peak = Math.max(0, ...reported.map((entry) => num(entry.metrics.vmhwmBytes)));
        const state = Math.max(0, ...reported.map((entry) => num(entry.metrics.memory.optimizerStateBytes)));
        const formula = formulas.get(id);
        return [jobLink(id), stateBadge(job.state), modeName(job), workloadName(job), String(worldSize(job) || "\u2014"),
          String(progress.length), progress.length ? C.formatNumber(num(last.loss)) : "\u2014",
          median ? ms(median) : "\u2014", C.formatBytes(state), formula ? C.formatBytes(formula.total) : "\u2014",
          peak ? C.formatBytes(peak) : "\u2014"];
      });
      replace(tableBox, table(["job", "state", "mode", "workload", "W", "steps", "last loss", "median iteration",
        "opt state / rank", "ZeRO formula / rank", "max peak RSS"], rows));
      if (allCaughtUp) root.setAttribute("data-ready", "true");
    }, () => !allCaughtUp || [...jobs.values()].some((job) => !ENDED.has(job.state)));
  }

  // ---- router --------------------------------------------------------------------------------

  function route() {
    if (current) current.stop();
    const hash = window.location.hash.replace(/^#/, "") || "/cluster";
    const [path, query] = hash.split("?");
    const parts = path.split("/").filter((p) => p);
    document.querySelectorAll("nav a").forEach((a) => {
      a.classList.toggle("active", a.getAttribute("href") === "#/" + (parts[0] || "cluster"));
    });
    if (parts[0] === "jobs" && parts[1]) current = jobPage(decodeURIComponent(parts[1]));
    else if (parts[0] === "jobs") current = jobsPage();
    else if (parts[0] === "compare") current = comparePage(query || "");
    else current = clusterPage();
  }

  window.addEventListener("hashchange", route);
  route();
})();
