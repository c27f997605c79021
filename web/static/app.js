// Trickle's browser page: submit a job, then follow its tokens over SSE (EventSource, or a
// fetch() stream when an API key must go in a header) or WebSocket, resuming after drops.
//
// Watching: /?job=<id>&token=<stream token> (or a stream URL pasted into "Watch a job") follows
// any job, with the token a backend got in the job's urls instead of an API key.
//
// Status comes from the stream's "status" events (queued with its place in line and expected
// start, refreshed every second; running; the final state); the page never polls for it.
//
// Exactly-once: the page keeps the last token index it has shown and every (re)connection asks
// for events after it; an index already shown is ignored and a gap forces a reconnect, so
// no text is ever duplicated or lost, whatever the transport does.
//
// For tests and the curious, #output carries data-job-id, data-status, data-state
// (idle | streaming | final), data-tokens (token events shown), data-renders (DOM updates),
// data-reconnects and data-duplicates (events ignored because already shown).
"use strict";

(() => {
  const KEY_STORAGE = "trickle.apiKey";
  const PREFS_STORAGE = "trickle.prefs";
  const PARAM_FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop"];
  const ERROR_FIELDS = new Set(["model", "prompt", ...PARAM_FIELDS]);
  const TERMINAL = new Set(["succeeded", "failed", "canceled", "expired"]);
  // Ended with an error worth showing: failed, or expired (not started before its deadline).
  const ENDED_WITH_ERROR = new Map([["failed", "Failed"], ["expired", "Expired"]]);
  const RECONNECT_DELAYS_MS = [250, 500, 1000, 2000, 4000];
  const CANCEL_GRACE_MS = 2000;
  const MIN_RATE_SPAN_MS = 250;

  const $ = (id) => document.getElementById(id);
  const el = {
    form: $("job-form"),
    model: $("model"),
    prompt: $("prompt"),
    maxTokens: $("max_tokens"),
    temperature: $("temperature"),
    topP: $("top_p"),
    topK: $("top_k"),
    seed: $("seed"),
    stop: $("stop"),
    ignoreEos: $("ignore_eos"),
    sse: $("transport-sse"),
    ws: $("transport-ws"),
    transportHint: $("transport-hint"),
    formError: $("form-error"),
    generate: $("generate"),
    stopButton: $("stop-button"),
    status: $("status"),
    ttft: $("stat-ttft"),
    rate: $("stat-rate"),
    tokens: $("stat-tokens"),
    elapsed: $("stat-elapsed"),
    output: $("output"),
    meta: $("meta"),
    copy: $("copy"),
    announce: $("announce"),
    keyToggle: $("key-toggle"),
    keyPanel: $("key-panel"),
    keyForm: $("key-form"),
    keyInput: $("api-key"),
    keyNote: $("key-note"),
    keyForget: $("key-forget"),
    watchForm: $("watch-form"),
    watchUrl: $("watch-url"),
  };

  let apiKey = storageGet(KEY_STORAGE) || "";
  let run = null; // the job on screen (see startRun)
  let watchToken = ""; // the stream token of the job being watched, if any

  // ---------------------------------------------------------------- small helpers

  function storageGet(name) {
    try {
      return localStorage.getItem(name);
    } catch {
      return null; // storage disabled: the page still works, it just forgets
    }
  }

  function storageSet(name, value) {
    try {
      if (value === null) localStorage.removeItem(name);
      else localStorage.setItem(name, value);
    } catch {
      /* ignore */
    }
  }

  function formatDuration(ms) {
    if (ms === null || ms === undefined || !isFinite(ms)) return "—";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
    return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
  }

  function formatRate(tokens, ms) {
    if (!tokens || !ms || ms <= 0) return "—";
    const rate = (tokens * 1000) / ms;
    return rate >= 100 ? String(Math.round(rate)) : rate.toFixed(1);
  }

  class ApiError extends Error {
    constructor(status, error, retryAfter) {
      super((error && error.message) || `HTTP ${status}`);
      this.status = status; // 0: the request never got an answer
      this.param = (error && error.param) || null;
      this.type = (error && error.type) || null;
      this.retryAfter = retryAfter || null;
    }
  }

  function authHeaders() {
    return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json", ...authHeaders() };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {
        method: options.method || "GET",
        headers,
        body: options.body,
        cache: "no-store",
      });
    } catch {
      throw new ApiError(0, { message: "Cannot reach the server (network error)." });
    }
    let data = null;
    try {
      data = await response.json();
    } catch {
      /* not JSON: reported below by status */
    }
    if (!response.ok) {
      const error = data && data.error ? data.error : { message: `HTTP ${response.status}` };
      throw new ApiError(response.status, error, response.headers.get("Retry-After"));
    }
    return data;
  }

  const jobPath = (id) => `/v1/jobs/${encodeURIComponent(id)}`;
  // A watched job's token goes on every read of it (the job, its stream); never an API key.
  const tokenQuery = (current) => (current.token ? `token=${encodeURIComponent(current.token)}` : "");
  const jobUrl = (current) => `${jobPath(current.id)}${current.token ? `?${tokenQuery(current)}` : ""}`;
  const streamQuery = (current) =>
    `after=${current.last}${current.token ? `&${tokenQuery(current)}` : ""}`;

  // ---------------------------------------------------------------- errors next to the form

  function clearErrors() {
    el.formError.hidden = true;
    el.formError.textContent = "";
    for (const name of ERROR_FIELDS) {
      const input = $(name);
      const slot = $(`${name}-error`);
      if (input) input.removeAttribute("aria-invalid");
      if (slot) slot.textContent = "";
    }
  }

  function showError(message, param) {
    el.formError.textContent = message;
    el.formError.hidden = false;
    if (param && ERROR_FIELDS.has(param)) {
      const input = $(param);
      const slot = $(`${param}-error`);
      if (slot) slot.textContent = message;
      if (input) {
        input.setAttribute("aria-invalid", "true");
        if (input.closest("details")) input.closest("details").open = true;
        input.focus();
      }
    }
  }

  function showApiError(error) {
    if (!(error instanceof ApiError)) {
      showError(String(error && error.message ? error.message : error));
      return;
    }
    if (error.status === 401) {
      openKeyPanel(apiKey ? "That API key was refused; enter another." : "This server needs an API key.");
    }
    let message = error.message;
    if (error.retryAfter) message += ` Try again in ${error.retryAfter} s.`;
    showError(message, error.param);
  }

  // ---------------------------------------------------------------- API key

  function openKeyPanel(note) {
    el.keyPanel.hidden = false;
    el.keyToggle.setAttribute("aria-expanded", "true");
    if (note) {
      el.keyNote.textContent = note;
      el.keyNote.classList.add("warn");
    }
    el.keyInput.value = apiKey;
    el.keyInput.focus();
  }

  function closeKeyPanel() {
    el.keyPanel.hidden = true;
    el.keyToggle.setAttribute("aria-expanded", "false");
  }

  function setApiKey(key) {
    apiKey = key.trim();
    storageSet(KEY_STORAGE, apiKey || null);
    el.keyToggle.textContent = apiKey ? "API key ✓" : "API key";
    updateTransportAvailability();
  }

  el.keyToggle.addEventListener("click", () => {
    if (el.keyPanel.hidden) openKeyPanel();
    else closeKeyPanel();
  });
  el.keyForm.addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey(el.keyInput.value);
    el.keyNote.classList.remove("warn");
    closeKeyPanel();
    clearErrors();
    loadModels();
  });
  el.keyForget.addEventListener("click", () => {
    setApiKey("");
    el.keyInput.value = "";
    closeKeyPanel();
    loadModels();
  });

  // Browsers cannot put an Authorization header on a WebSocket handshake.
  function updateTransportAvailability() {
    el.ws.disabled = Boolean(apiKey);
    if (apiKey && el.ws.checked) el.sse.checked = true;
    el.transportHint.textContent = apiKey
      ? "With an API key the page streams SSE over fetch(): browsers cannot send the key on a WebSocket."
      : "";
  }

  // ---------------------------------------------------------------- models and preferences

  async function loadModels() {
    const wanted = el.model.value || (readPrefs().model ?? "");
    el.model.disabled = true;
    try {
      const data = await api("/v1/models");
      const names = (data.data || []).map((model) => model.id);
      el.model.replaceChildren(
        ...names.map((name) => new Option(name, name, false, name === wanted)),
      );
      if (!names.includes(wanted) && names.length) el.model.value = names[0];
      if (!names.length) el.model.replaceChildren(new Option("no models configured", ""));
    } catch (error) {
      el.model.replaceChildren(new Option(error.status === 401 ? "API key needed" : "unavailable", ""));
      // Watching with a stream token needs no key: keep the watch's own messages on screen.
      if (!watchToken) showApiError(error);
    } finally {
      el.model.disabled = false;
    }
  }

  function readPrefs() {
    try {
      return JSON.parse(storageGet(PREFS_STORAGE) || "{}") || {};
    } catch {
      return {};
    }
  }

  function savePrefs() {
    const prefs = { model: el.model.value, prompt: el.prompt.value, ignore_eos: el.ignoreEos.checked };
    for (const name of PARAM_FIELDS) prefs[name] = $(name).value;
    prefs.transport = el.ws.checked ? "ws" : "sse";
    storageSet(PREFS_STORAGE, JSON.stringify(prefs));
  }

  function restorePrefs() {
    const prefs = readPrefs();
    if (typeof prefs.prompt === "string") el.prompt.value = prefs.prompt;
    for (const name of PARAM_FIELDS) {
      if (typeof prefs[name] === "string") $(name).value = prefs[name];
    }
    el.ignoreEos.checked = Boolean(prefs.ignore_eos);
    if (prefs.transport === "ws") el.ws.checked = true;
  }

  // ---------------------------------------------------------------- the request body

  class FieldError extends Error {
    constructor(param, message) {
      super(message);
      this.param = param;
    }
  }

  function numberField(name, integer) {
    const input = $(name);
    if (input.validity.badInput) throw new FieldError(name, `${input.labels[0].textContent} must be a number.`);
    if (input.value.trim() === "") return undefined; // the server's default
    const value = Number(input.value);
    if (integer && !Number.isInteger(value)) {
      throw new FieldError(name, `${input.labels[0].textContent} must be a whole number.`);
    }
    return value;
  }

  function stopSequences() {
    const unescape = (line) =>
      line.replace(/\\(n|t|r|\\)/g, (_, c) => ({ n: "\n", t: "\t", r: "\r", "\\": "\\" })[c]);
    const stops = el.stop.value
      .split("\n")
      .filter((line) => line.length > 0)
      .map(unescape);
    return stops.length ? stops : undefined;
  }

  // The JSON text of the request. A seed may exceed 2^53, so it goes in as written, unparsed.
  function requestBody() {
    const body = {
      prompt: el.prompt.value,
      model: el.model.value || undefined,
      max_tokens: numberField("max_tokens", true),
      temperature: numberField("temperature", false),
      top_p: numberField("top_p", false),
      top_k: numberField("top_k", true),
      stop: stopSequences(),
      ignore_eos: el.ignoreEos.checked || undefined,
    };
    let json = JSON.stringify(body);
    const seed = el.seed.value.trim();
    if (/^\d+$/.test(seed)) json = `${json.slice(0, -1)},"seed":${seed}}`;
    else if (seed) json = `${json.slice(0, -1)},"seed":${JSON.stringify(seed)}}`; // the API explains
    return json;
  }

  // ---------------------------------------------------------------- one job on screen

  // "3rd in line, about 1.2 s": the job's place (jobs ahead + 1) and its expected start.
  function ordinal(n) {
    const teen = n % 100 >= 11 && n % 100 <= 13;
    const suffix = teen ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th";
    return `${n}${suffix}`;
  }

  function waitingText(position, eta) {
    const place = typeof position === "number" ? `${ordinal(position + 1)} in line` : "queued";
    if (typeof eta !== "number") return place;
    return `${place}, about ${eta < 10 ? eta.toFixed(1) : Math.round(eta)} s`;
  }

  function setStatus(status, position, eta) {
    el.status.textContent = status === "queued" ? waitingText(position, eta) : status;
    el.status.dataset.status = status;
    el.output.dataset.status = status;
  }

  // token: the job's stream token when watching a job this page did not submit.
  function startRun(job, submittedAt, transport, token = "") {
    const text = document.createTextNode("");
    el.output.replaceChildren(text);
    el.output.classList.remove("empty", "final");
    el.output.classList.add("streaming");
    Object.assign(el.output.dataset, {
      jobId: job.id,
      state: "streaming",
      tokens: "0",
      renders: "0",
      reconnects: "0",
      duplicates: "0",
      transport,
    });
    delete el.output.dataset.mismatch;
    el.output.setAttribute("aria-busy", "true");
    el.meta.textContent = `Job ${job.id}`;
    el.meta.classList.remove("error");
    el.copy.hidden = true;
    run = {
      id: job.id,
      token,
      transport,
      submittedAt,
      firstTokenAt: null,
      lastTokenAt: null,
      endedAt: null,
      last: -1, // the last token index on screen
      text: "",
      pending: "",
      node: text,
      tokens: 0,
      renders: 0,
      reconnects: 0,
      duplicates: 0,
      retry: 0,
      connection: 0,
      stream: null,
      job: null, // the finished job, from "done"
      finished: false,
      renderQueued: false,
      timers: new Set(),
      statuses: [], // the status events received, in order
    };
    setStatus(job.status);
    el.generate.disabled = true;
    el.stopButton.disabled = Boolean(token); // a stream token reads; it cannot cancel
    const current = run;
    later(current, tick, 100, true);
    connect(current);
    tick();
  }

  function later(current, fn, ms, repeat) {
    const id = repeat ? setInterval(fn, ms) : setTimeout(fn, ms);
    current.timers.add(id);
    return id;
  }

  function tick() {
    if (!run) return;
    const now = run.endedAt ?? performance.now();
    el.elapsed.textContent = formatDuration(now - run.submittedAt);
    el.ttft.textContent = run.firstTokenAt === null ? "—" : formatDuration(run.firstTokenAt - run.submittedAt);
    el.tokens.textContent = String(run.tokens);
    el.rate.textContent = rate(run, now);
  }

  // Live: tokens received per second since the first one (once there is a span worth measuring).
  // Final: the server's generation rate, because a client that connects late gets the tokens
  // generated so far in one burst from the replay log, which says nothing about the model.
  function rate(current, now) {
    const server = current.job && current.job.metrics && current.job.metrics.tokens_per_second;
    if (current.finished && typeof server === "number") return formatRate(server, 1000);
    if (current.firstTokenAt === null) return "—";
    const span = (current.finished ? current.lastTokenAt : now) - current.firstTokenAt;
    return span < MIN_RATE_SPAN_MS ? "—" : formatRate(current.tokens, span);
  }

  function onStatus(current, data) {
    if (el.status.dataset.status === "canceling" && !TERMINAL.has(data.status)) return;
    if (current.statuses[current.statuses.length - 1] !== data.status) {
      current.statuses.push(data.status); // a queued job's refreshes are one status
      el.output.dataset.statuses = current.statuses.join(" ");
    }
    setStatus(data.status, data.position, data.eta_seconds);
  }

  function render() {
    if (!run) return;
    run.renderQueued = false;
    if (run.pending) {
      run.node.appendData(run.pending);
      run.pending = "";
      run.renders += 1;
      el.output.dataset.renders = String(run.renders);
    }
    el.output.dataset.tokens = String(run.tokens);
    if (!run.finished && isNearBottom()) el.output.scrollTop = el.output.scrollHeight;
    tick();
  }

  function isNearBottom() {
    const out = el.output;
    return out.scrollHeight - out.scrollTop - out.clientHeight < 48;
  }

  // A WebSocket frame carries a run of tokens: index is its first, count how many.
  function onToken(current, index, text, count = 1) {
    if (index <= current.last) {
      current.duplicates += 1; // already on screen (a resumed stream overlapping): ignore
      el.output.dataset.duplicates = String(current.duplicates);
      return;
    }
    if (index !== current.last + 1) {
      reconnect(current, 0); // a gap should never happen; asking again from the last index heals it
      return;
    }
    const now = performance.now();
    if (current.firstTokenAt === null) {
      current.firstTokenAt = now;
      setStatus("running");
    } else if (el.status.dataset.status !== "running" && el.status.dataset.status !== "canceling") {
      setStatus("running"); // back from "reconnecting"
    }
    current.last = index + count - 1;
    current.lastTokenAt = now;
    current.tokens += count;
    current.retry = 0;
    current.text += text;
    current.pending += text;
    if (!current.renderQueued) {
      current.renderQueued = true;
      requestAnimationFrame(render);
    }
  }

  function finish(current, job) {
    if (current.finished) return;
    current.finished = true;
    current.endedAt = performance.now();
    current.job = job;
    closeStream(current);
    for (const id of current.timers) {
      clearInterval(id);
      clearTimeout(id);
    }
    render();
    if (typeof job.output === "string" && job.output !== current.text) {
      // Never expected (the stream equals the stored result); the stored result wins.
      console.warn("streamed text differs from the stored output; showing the stored output");
      el.output.dataset.mismatch = "true";
      current.text = job.output;
      current.node.data = job.output;
    }
    el.output.classList.remove("streaming");
    el.output.classList.add("final");
    el.output.dataset.state = "final";
    el.output.dataset.tokens = String(current.tokens);
    el.output.setAttribute("aria-busy", "false");
    setStatus(job.status);
    tick();
    el.meta.classList.toggle("error", ENDED_WITH_ERROR.has(job.status));
    el.meta.textContent = describeJob(job);
    el.copy.hidden = !current.text || !navigator.clipboard;
    el.generate.disabled = false;
    el.stopButton.disabled = true;
    el.announce.textContent = `Generation ${job.status}, ${current.tokens} tokens.`;
  }

  function describeJob(job) {
    const parts = [];
    if (ENDED_WITH_ERROR.has(job.status) && job.error) {
      parts.push(`${ENDED_WITH_ERROR.get(job.status)}: ${job.error.message}`);
    }
    if (job.finish_reason) parts.push(`finish: ${job.finish_reason}`);
    const metrics = job.metrics || {};
    const server = [];
    if (typeof metrics.time_to_first_token_seconds === "number") {
      server.push(`first token ${formatDuration(metrics.time_to_first_token_seconds * 1000)}`);
    }
    if (server.length) parts.push(`server: ${server.join(", ")}`);
    if (typeof metrics.queue_seconds === "number") {
      server.push(`queued ${formatDuration(metrics.queue_seconds * 1000)}`);
    }
    if (job.usage) parts.push(`${job.usage.prompt_tokens} prompt tokens`);
    parts.push(job.id);
    return parts.join(" · ");
  }

  function fail(current, message) {
    if (current.finished) return;
    current.finished = true;
    current.endedAt = performance.now();
    closeStream(current);
    for (const id of current.timers) {
      clearInterval(id);
      clearTimeout(id);
    }
    render();
    el.output.classList.remove("streaming");
    el.output.dataset.state = "final";
    el.output.setAttribute("aria-busy", "false");
    setStatus("error");
    el.meta.classList.add("error");
    el.meta.textContent = message;
    el.generate.disabled = false;
    el.stopButton.disabled = true;
  }

  // ---------------------------------------------------------------- streaming and resuming

  function closeStream(current) {
    current.connection += 1; // events from the old connection are ignored from now on
    if (current.stream) current.stream.close();
    current.stream = null;
  }

  function connect(current) {
    closeStream(current);
    const connection = current.connection;
    const live = () => current === run && !current.finished && current.connection === connection;
    const handlers = {
      token: (index, text, count) => live() && onToken(current, index, text, count),
      status: (data) => live() && onStatus(current, data),
      done: (job) => live() && finish(current, job),
      drop: () => live() && reconnect(current),
      fatal: (error) => live() && fail(current, error.message),
    };
    const sse = apiKey && !current.token ? fetchStream : eventSource;
    const open = { sse, ws: webSocket }[current.transport];
    current.stream = open(current.id, streamQuery(current), handlers);
  }

  function reconnect(current, delay) {
    closeStream(current);
    if (current.finished) return;
    current.reconnects += 1;
    el.output.dataset.reconnects = String(current.reconnects);
    const wait = delay ?? RECONNECT_DELAYS_MS[Math.min(current.retry, RECONNECT_DELAYS_MS.length - 1)];
    current.retry += 1;
    if (wait > 0) setStatus("reconnecting");
    const connection = current.connection;
    const timer = later(current, async () => {
      current.timers.delete(timer);
      if (current !== run || current.finished || current.connection !== connection) return;
      try {
        const job = await api(jobUrl(current)); // tells a vanished job from a network drop
        if (el.status.dataset.status === "reconnecting" && !TERMINAL.has(job.status)) {
          setStatus(job.status);
        }
      } catch (error) {
        if (current.connection !== connection) return;
        if (error.status >= 400 && error.status < 500 && error.status !== 429) {
          fail(current, error.message);
          if (error.status === 401) showApiError(error);
          return;
        }
        reconnect(current); // still unreachable: back off and try again
        return;
      }
      if (current === run && !current.finished && current.connection === connection) connect(current);
    }, wait, false);
  }

  function eventSource(id, query, handlers) {
    const source = new EventSource(`${jobPath(id)}/events?${query}`);
    source.addEventListener("token", (event) => {
      const data = JSON.parse(event.data);
      handlers.token(data.index, data.text);
    });
    source.addEventListener("status", (event) => handlers.status(JSON.parse(event.data)));
    source.addEventListener("done", (event) => {
      source.close(); // or the browser reconnects by itself
      handlers.done(JSON.parse(event.data));
    });
    source.addEventListener("error", () => {
      // A network drop, an HTTP error or the server's own "error" event (Redis away): close
      // the browser's automatic retry and resume ourselves from the last index shown.
      source.close();
      handlers.drop();
    });
    return { close: () => source.close() };
  }

  // SSE over fetch(), for when the request needs an Authorization header.
  function fetchStream(id, query, handlers) {
    const controller = new AbortController();
    (async () => {
      let response;
      try {
        response = await fetch(`${jobPath(id)}/events?${query}`, {
          headers: { Accept: "text/event-stream", ...authHeaders() },
          signal: controller.signal,
          cache: "no-store",
        });
      } catch {
        if (!controller.signal.aborted) handlers.drop();
        return;
      }
      if (!response.ok) {
        let error = { message: `HTTP ${response.status}` };
        try {
          error = (await response.json()).error || error;
        } catch {
          /* keep the status line */
        }
        if (response.status >= 500 || response.status === 429) handlers.drop();
        else handlers.fatal(new ApiError(response.status, error));
        return;
      }
      const parser = sseParser((type, data) => {
        if (type === "token") {
          const event = JSON.parse(data);
          handlers.token(event.index, event.text);
        } else if (type === "status") {
          handlers.status(JSON.parse(data));
        } else if (type === "done") {
          controller.abort();
          handlers.done(JSON.parse(data));
        } else if (type === "error") {
          controller.abort();
          handlers.drop();
        }
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser(value);
        }
      } catch {
        /* aborted or dropped: decided below */
      }
      if (!controller.signal.aborted) handlers.drop(); // ended without "done"
    })();
    return { close: () => controller.abort() };
  }

  // A text/event-stream parser (the WHATWG algorithm, minus what this API never sends).
  function sseParser(dispatch) {
    let buffer = "";
    let type = "";
    let data = [];
    const line = (text) => {
      if (text === "") {
        if (data.length) dispatch(type || "message", data.join("\n"));
        type = "";
        data = [];
        return;
      }
      if (text.startsWith(":")) return; // keep-alive comment
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") type = value;
      else if (field === "data") data.push(value);
    };
    return (chunk) => {
      buffer += chunk;
      for (;;) {
        const match = /\r\n|\r|\n/.exec(buffer);
        if (!match) return;
        if (match[0] === "\r" && match.index === buffer.length - 1) return; // maybe \r\n, split
        line(buffer.slice(0, match.index));
        buffer = buffer.slice(match.index + match[0].length);
      }
    };
  }

  function webSocket(id, query, handlers) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}${jobPath(id)}/ws?${query}`);
    let closing = false;
    let error = null;
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.event === "token") handlers.token(message.index, message.text, message.count);
      else if (message.event === "status") handlers.status(message);
      else if (message.event === "done") {
        closing = true;
        socket.close();
        handlers.done(message.job);
      } else if (message.event === "error") error = message.error;
    });
    socket.addEventListener("close", (event) => {
      if (closing) return;
      if (event.code === 4404) handlers.fatal(new ApiError(404, error));
      else handlers.drop();
    });
    return {
      close: () => {
        closing = true;
        socket.close();
      },
    };
  }

  // ---------------------------------------------------------------- actions

  async function submit() {
    if (run && !run.finished) return;
    clearErrors();
    let body;
    try {
      body = requestBody();
    } catch (error) {
      showError(error.message, error.param);
      return;
    }
    savePrefs();
    const transport = el.ws.checked && !apiKey ? "ws" : "sse";
    el.generate.disabled = true;
    el.generate.textContent = "Submitting…";
    const submittedAt = performance.now();
    try {
      const job = await api("/v1/jobs", { method: "POST", body });
      startRun(job, submittedAt, transport);
    } catch (error) {
      el.generate.disabled = false;
      showApiError(error);
    } finally {
      el.generate.textContent = "Generate";
    }
  }

  // A job from a stream URL (…/v1/jobs/<id>/events?token=…, or its /ws twin) or a bare id.
  function parseWatch(text) {
    const value = text.trim();
    if (/^job_[0-9a-f]+$/.test(value)) return { id: value, token: "", ws: false };
    let url;
    try {
      url = new URL(value, location.href);
    } catch {
      return null;
    }
    const match = /\/v1\/jobs\/(job_[0-9a-f]+)(?:\/(events|ws))?$/.exec(url.pathname);
    if (!match) return null;
    return { id: match[1], token: url.searchParams.get("token") || "", ws: match[2] === "ws" };
  }

  async function watch(id, token, ws) {
    watchToken = token;
    if (run && !run.finished) finish(run, { id: run.id, status: "stopped watching" });
    clearErrors();
    const transport = ws || (el.ws.checked && (token || !apiKey)) ? "ws" : "sse";
    try {
      const path = `${jobPath(id)}${token ? `?token=${encodeURIComponent(token)}` : ""}`;
      startRun(await api(path), performance.now(), transport, token);
    } catch (error) {
      setStatus("error");
      el.meta.classList.add("error");
      el.meta.textContent = error.message;
      if (token && error.status === 401) showError(error.message, null); // the token, not a key
      else showApiError(error);
    }
  }

  el.watchForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const target = parseWatch(el.watchUrl.value);
    if (!target) {
      showError("Paste a stream URL (…/v1/jobs/job_…/events?token=…) or a job id.");
      return;
    }
    watch(target.id, target.token, target.ws);
  });

  async function stop() {
    const current = run;
    if (!current || current.finished) return;
    el.stopButton.disabled = true;
    const before = el.status.dataset.status;
    setStatus("canceling");
    try {
      const job = await api(`${jobPath(current.id)}/cancel`, { method: "POST" });
      // The stream ends with "done" (status canceled); if it is slow to say so, the answer here
      // is authoritative.
      if (TERMINAL.has(job.status)) later(current, () => finish(current, job), CANCEL_GRACE_MS, false);
    } catch (error) {
      if (current.finished) return;
      el.stopButton.disabled = false;
      setStatus(before);
      showApiError(error);
    }
  }

  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  el.stopButton.addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      submit();
    }
  });
  for (const name of ERROR_FIELDS) {
    const input = $(name);
    if (input) {
      input.addEventListener("input", () => {
        input.removeAttribute("aria-invalid");
        const slot = $(`${name}-error`);
        if (slot) slot.textContent = "";
      });
    }
  }
  el.copy.addEventListener("click", async () => {
    if (!run) return;
    try {
      await navigator.clipboard.writeText(run.text);
      el.copy.textContent = "Copied";
    } catch {
      el.copy.textContent = "Copy failed";
    }
    setTimeout(() => {
      el.copy.textContent = "Copy";
    }, 1500);
  });

  // ---------------------------------------------------------------- start

  if (/Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent)) {
    for (const kbd of document.querySelectorAll(".kbd-mod")) kbd.textContent = "⌘";
  }
  restorePrefs();
  setApiKey(apiKey);
  const linked = new URLSearchParams(location.search);
  if (linked.get("job")) {
    el.watchUrl.value = linked.get("job");
    watch(linked.get("job"), linked.get("token") || "", linked.get("transport") === "ws");
  }
  loadModels();
})();
