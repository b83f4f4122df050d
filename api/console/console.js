// The inferq console: submit a job over WS /v1/generate and watch its tokens, the jobs sent from
// this page (GET /v1/jobs/{id}), the queue (GET /v1/queue) and the workers (GET /v1/workers).
// No dependencies and no build step: the gateway serves this file as it is.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  // The API is where the page is (also behind a proxy that serves it under a path prefix).
  const BASE = location.pathname.replace(/\/console\/?$/, "");
  const WS_BASE = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + BASE;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const UNKNOWN = "unknown"; // the API no longer knows the job (expired, or another key's): not polled
  const KEY_STORE = "inferq.console.apiKey";
  const REFRESH_MS = 1000;
  const MODELS_EVERY = 10; // refreshes between two reads of /v1/models
  // Tokens come one event each, hundreds a second: they are drawn at most every DRAW_MS, one
  // append and one layout per draw (one per token froze the tab on a long stream).
  const DRAW_MS = 50;

  const state = {
    ws: null,          // the open generate socket, if any
    jobId: null,       // the job shown in #output
    finished: false,   // its stream ended with done or error
    cancelPending: false,
    tokens: 0,
    pending: "",       // text received and not drawn yet
    drawTimer: null,
    models: [],
    jobs: new Map(),   // id -> {id, model, prompt, status, tokens}, in submission order
    ticks: 0,
  };

  class ApiError extends Error {
    constructor(status, body) {
      const err = body && body.error ? body.error : {};
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.type = err.type || "error";
    }
  }

  const apiKey = () => $("api-key").value.trim();

  async function api(method, path) {
    const headers = { Accept: "application/json" };
    if (apiKey()) headers.Authorization = "Bearer " + apiKey();
    const r = await fetch(BASE + path, { method, headers, cache: "no-store" });
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (r.status === 401) authError(new ApiError(r.status, body));
    else $("auth-error").hidden = true;
    if (!r.ok) throw new ApiError(r.status, body);
    return body;
  }

  function authError(err) {
    const box = $("auth-error");
    box.textContent = `${err.type}: ${err.message}. Enter a valid API key above.`;
    box.hidden = false;
  }

  function showError(err) {
    const box = $("error");
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    box.textContent = err.type ? `${err.type}: ${err.message}` : String(err.message || err);
    box.hidden = false;
  }

  function setStatus(status) {
    const el = $("status");
    el.textContent = status;
    el.className = "status status-" + status;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  // --- generate ------------------------------------------------------------------------------

  function number(id, integer) {
    const raw = $(id).value.trim();
    if (raw === "") return undefined;
    const v = Number(raw);
    if (!Number.isFinite(v) || (integer && !Number.isInteger(v))) throw new Error(`${id}: not a number`);
    return v;
  }

  function buildRequest() {
    const req = { prompt: $("prompt").value };
    const fields = [["max_tokens", "max-tokens", true], ["temperature", "temperature", false],
      ["top_p", "top-p", false], ["priority", "priority", true]];
    for (const [name, id, integer] of fields) {
      const v = number(id, integer);
      if (v !== undefined) req[name] = v;
    }
    if ($("ignore-eos").checked) req.ignore_eos = true;
    if ($("model").value) req.model = $("model").value;
    return req;
  }

  function setStreaming(on) {
    $("send").disabled = on;
    $("cancel").disabled = !on;
  }

  function send() {
    if (state.ws) return;
    let req;
    try { req = buildRequest(); } catch (e) { showError(e); return; }
    showError(null);
    clearOutput("");
    $("job-id").textContent = "";
    $("tokens").textContent = "0";
    Object.assign(state, { jobId: null, finished: false, cancelPending: false, tokens: 0 });
    setStatus("connecting");
    const url = WS_BASE + "/v1/generate" + (apiKey() ? "?api_key=" + encodeURIComponent(apiKey()) : "");
    const ws = new WebSocket(url);
    state.ws = ws;
    setStreaming(true);
    ws.onopen = () => ws.send(JSON.stringify(req));
    ws.onmessage = (m) => { if (ws === state.ws) onEvent(JSON.parse(m.data), req); };
    ws.onclose = (e) => { if (ws === state.ws) onClose(e); };
  }

  function onEvent(ev, req) {
    switch (ev.type) {
      case "accepted":
        state.jobId = ev.id;
        $("job-id").textContent = ev.id;
        setStatus("queued");
        addJob(ev.id, ev.model, req.prompt);
        if (state.cancelPending) cancel();
        break;
      case "token":
        if ((ev.index || 0) !== 0) break;
        if ($("status").textContent !== "running") setStatus("running");
        state.tokens += ev.n_tokens || 0;
        appendOutput(ev.text);
        if (state.jobs.get(state.jobId).status === "queued") updateJob(state.jobId, { status: "running" });
        break;
      case "loading": // no worker holds the model awake: the job waits for one to wake it
        setStatus("loading");
        clearOutput(`[model ${ev.model} is asleep: waiting for a worker to wake it` +
          (ev.expected_s === null || ev.expected_s === undefined ? "]" : `, about ${ev.expected_s} s]`));
        break;
      case "restart": // the attempt was lost; the job runs again from the start
        state.tokens = 0;
        clearOutput("");
        setStatus("running");
        break;
      case "done":
        drawOutput();
        state.finished = true;
        setStatus(ev.status);
        updateJob(state.jobId, { status: ev.status, tokens: ev.usage.completion_tokens });
        break;
      case "error":
        drawOutput();
        state.finished = true;
        showError(ev.error);
        if (ev.error && ev.error.type === "authentication_error") authError(ev.error);
        setStatus(state.jobId ? "failed" : "rejected");
        if (state.jobId) updateJob(state.jobId, { status: "failed" });
        break;
    }
  }

  function appendOutput(text) {
    state.pending += text;
    if (state.drawTimer === null) state.drawTimer = setTimeout(drawOutput, DRAW_MS);
  }

  function drawOutput() {
    clearTimeout(state.drawTimer);
    state.drawTimer = null;
    $("tokens").textContent = String(state.tokens);
    if (!state.pending) return;
    const out = $("output");
    const following = out.scrollTop + out.clientHeight >= out.scrollHeight - 8; // the reader is at the end
    out.append(document.createTextNode(state.pending));
    state.pending = "";
    if (following) out.scrollTop = out.scrollHeight;
  }

  function clearOutput(text) {
    clearTimeout(state.drawTimer);
    Object.assign(state, { pending: "", drawTimer: null });
    $("output").textContent = text;
    $("tokens").textContent = String(state.tokens);
  }

  function onClose(e) {
    drawOutput();
    state.ws = null;
    setStreaming(false);
    if (state.finished) return;
    if (state.cancelPending) setStatus("cancelling"); // the job list's poll shows when it is cancelled
    else if (state.jobId) setStatus("disconnected");
    else { setStatus("disconnected"); showError(new Error(`the connection closed (code ${e.code})`)); }
  }

  async function cancel() {
    state.cancelPending = true;
    const id = state.jobId;
    if (!id) { setStatus("cancelling"); return; } // cancelled as soon as it is accepted
    setStatus("cancelling");
    if (state.ws) state.ws.close(1000, "cancel"); // closing the socket cancels the job
    try {
      const view = await api("DELETE", `/v1/jobs/${id}`); // and so does this, socket or not
      updateJob(id, { status: view.status });
    } catch (e) {
      showError(e);
    }
  }

  // --- jobs ----------------------------------------------------------------------------------

  function addJob(id, model, prompt) {
    state.jobs.set(id, { id, model, prompt, status: "queued", tokens: 0 });
    renderJobs();
  }

  function updateJob(id, fields) {
    const job = state.jobs.get(id);
    if (!job) return;
    if (TERMINAL.has(job.status) && fields.status && !TERMINAL.has(fields.status)) delete fields.status;
    Object.assign(job, fields);
    renderJobs();
    // the socket is gone (closed to cancel, or lost): the job's own status tells how it ended
    const settled = fields.status && (TERMINAL.has(fields.status) || !state.cancelPending);
    if (id === state.jobId && !state.ws && settled) setStatus(fields.status);
  }

  function renderJobs() {
    const rows = [...state.jobs.values()].reverse().map((j) => {
      const tr = el("tr", { "data-job-id": j.id, title: j.id },
        el("td", { class: "id" }, el("code", {}, j.id.slice(0, 12) + "…")),
        el("td", { class: "status status-" + j.status }, j.status),
        el("td", { class: "tokens" }, j.tokens),
        el("td", { class: "model" }, j.model),
        el("td", { class: "prompt" }, j.prompt.slice(0, 80)));
      tr.addEventListener("click", () => showJob(j.id));
      return tr;
    });
    $("jobs").tBodies[0].replaceChildren(...rows);
  }

  async function showJob(id) {
    if (state.ws) return; // one job at a time in #output
    try {
      const view = await api("GET", `/v1/jobs/${id}`);
      Object.assign(state, { jobId: id, finished: TERMINAL.has(view.status), cancelPending: false });
      $("job-id").textContent = id;
      state.tokens = view.usage ? view.usage.completion_tokens : 0;
      clearOutput(view.text);
      setStatus(view.status);
      showError(view.error);
    } catch (e) {
      showError(e);
    }
  }

  async function refreshJobs() {
    const open = [...state.jobs.values()].filter((j) => !TERMINAL.has(j.status) && j.status !== UNKNOWN);
    await Promise.all(open.map(async (j) => {
      try {
        const view = await api("GET", `/v1/jobs/${j.id}`);
        const fields = { status: view.status };
        if (view.usage) fields.tokens = view.usage.completion_tokens;
        else if (j.id === state.jobId) fields.tokens = state.tokens;
        updateJob(j.id, fields);
      } catch (e) {
        if (e.status === 404) updateJob(j.id, { status: UNKNOWN });
      }
    }));
  }

  // --- models, queue, workers ----------------------------------------------------------------

  async function refreshModels() {
    const list = await api("GET", "/v1/models");
    const ids = list.data.map((m) => m.id);
    if (ids.join("\n") === state.models.join("\n")) return;
    state.models = ids;
    const select = $("model");
    const chosen = select.value;
    const options = (ids.length ? ids : [""]).map((id) => el("option", { value: id }, id || "(default)"));
    select.replaceChildren(...options);
    if (ids.includes(chosen)) select.value = chosen;
  }

  // one line of name: queued / running pairs (a model's classes, or its tenants)
  function loads(kind, title, byName) {
    return el("div", { class: "loads " + kind, title },
      ...Object.entries(byName).map(([name, n]) =>
        el("span", { "data-name": name, class: n.queued || n.running ? "busy" : "" },
          `${name}: ${n.queued} / ${n.running}`)));
  }

  async function refreshQueue() {
    const q = await api("GET", "/v1/queue");
    const blocks = q.models.map((m) => {
      const prio = el("div", { class: "prio", title: "jobs waiting by priority, 0 first" },
        ...Object.entries(m.by_priority).map(([p, n]) =>
          el("span", { class: n ? "busy" : "" }, `p${p}: ${n}`)));
      const age = m.oldest_age_s === null ? "" : ` (oldest ${m.oldest_age_s.toFixed(1)} s)`;
      return el("div", { class: "model-queue", "data-model": m.model },
        el("div", {}, el("b", {}, m.model)),
        el("div", { class: "stats" },
          el("span", {}, "queued ", el("b", { class: "queued" }, m.queued), age),
          el("span", {}, "running ", el("b", { class: "running" }, m.running)),
          el("span", {}, "workers ", el("b", { class: "live" }, m.workers),
            m.draining ? ` (+${m.draining} draining)` : ""),
          el("span", { title: "multi-model workers holding the model asleep" },
            "asleep ", el("b", { class: "asleep" }, m.asleep || 0))),
        loads("classes", "by service class: queued / running", m.classes || {}),
        loads("tenants", "by tenant (fair share): queued / running", m.tenants || {}),
        prio);
    });
    $("queue").replaceChildren(...blocks);
    $("updated").textContent = "updated " + new Date(q.at * 1000).toLocaleTimeString();
    renderSwappers(q.swappers || []);
  }

  // the multi-model workers: each model's state on them, and their last swap with what it took
  function renderSwappers(list) {
    const rows = list.map((w) => {
      const last = w.recent.length ? w.recent[w.recent.length - 1] : null;
      const swap = last ? `${last.from_model || "—"} → ${last.to_model}: ${last.total_s.toFixed(2)} s ` +
        `(drain ${last.drain_s.toFixed(2)}, sleep ${last.sleep_s.toFixed(2)}, ` +
        `${last.cold ? "start" : "wake"} ${last.wake_s.toFixed(2)})` : "—";
      return el("tr", { "data-swapper-id": w.id },
        el("td", { class: "id", title: w.id }, w.id),
        el("td", { class: "awake" }, w.awake || "—"),
        el("td", { class: "models" }, ...w.models.map((m) =>
          el("span", { class: "model-state " + m.state, "data-model": m.name,
            title: m.wake_s === null ? "never woken here" : `a wake takes ~${m.wake_s.toFixed(2)} s` },
          `${m.name}: ${m.state} `))),
        el("td", { class: "swaps" }, w.swaps),
        el("td", { class: "last-swap" }, swap));
    });
    $("swappers").tBodies[0].replaceChildren(...rows);
  }

  // what a worker holds by class, and its gate: "interactive 3 · batch 5 (limit 8 of 8 +2)"
  function classesOf(c) {
    if (!c) return "—";
    const held = Object.entries(c.running).map(([cls, byTenant]) =>
      `${cls} ${Object.values(byTenant).reduce((a, b) => a + b, 0)}`);
    return `${held.join(" · ") || "idle"} (limit ${c.batch_limit} of ${c.slots} +${c.reserve})`;
  }

  async function refreshWorkers() {
    const models = state.models.length ? state.models : [""];
    const lists = await Promise.all(models.map((m) =>
      api("GET", "/v1/workers" + (m ? "?model=" + encodeURIComponent(m) : ""))));
    const rows = lists.flat().sort((a, b) => a.id.localeCompare(b.id)).map((w) => {
      const kv = w.stats.kv_cache_usage;
      const bar = el("span", { class: "bar" }, el("i"));
      bar.firstChild.style.width = Math.min(100, kv * 100).toFixed(1) + "%";
      return el("tr", { "data-worker-id": w.id },
        el("td", { class: "id", title: w.id }, w.id),
        el("td", { class: "model" }, w.model),
        el("td", { class: "running" }, w.stats.running),
        el("td", { class: "waiting" }, w.stats.waiting),
        el("td", { class: "kv", "data-kv": String(kv) }, bar, (kv * 100).toFixed(1) + "%"),
        el("td", { class: "hits", title: "prompt tokens found in this engine's prefix cache, since it started" },
          w.stats.prefix_cache_queries ? (100 * w.stats.prefix_cache_hits / w.stats.prefix_cache_queries).toFixed(1) + "%"
            : "—"),
        el("td", { class: "adapters", title: "LoRA adapters loaded in this worker's engine" },
          (w.adapters || []).join(", ") || "—"),
        el("td", { class: "classes", title: "jobs it holds by service class; its batch limit of its slots (and "
          + "the slots only interactive work takes)" }, classesOf(w.classes)),
        el("td", { class: "state" }, w.draining ? "draining" : "live"));
    });
    $("workers").tBodies[0].replaceChildren(...rows);
  }

  async function tick() {
    if (state.ticks++ % MODELS_EVERY === 0) await refreshModels().catch(() => {});
    await Promise.allSettled([refreshQueue(), refreshWorkers(), refreshJobs()]);
    setTimeout(tick, REFRESH_MS);
  }

  // --- start ---------------------------------------------------------------------------------

  function start() {
    $("api-key").value = localStorage.getItem(KEY_STORE) || "";
    $("api-key").addEventListener("input", () => {
      localStorage.setItem(KEY_STORE, apiKey());
      state.ticks = 0; // read the models again with the new key
    });
    $("send").addEventListener("click", send);
    $("cancel").addEventListener("click", cancel);
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send();
    });
    tick();
  }

  start();
})();
