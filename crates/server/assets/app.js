// ds4server's page: a chat over this server's /v1/chat/completions (SSE
// read through fetch + ReadableStream) and a dashboard over /v1/status.
// No dependencies; nothing is fetched from anywhere but this server.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { convs: "ds4.conversations", current: "ds4.current", settings: "ds4.settings", key: "ds4.apiKey" };
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "seed", "mtp_depth"];

// ---------------------------------------------------------------- storage

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (_) {
    return fallback;
  }
}
function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (_) {
    /* storage full or disabled: the page still works for this visit */
  }
}

let conversations = load(STORE.convs, []);
let currentId = load(STORE.current, null);
let busy = null; // { controller, msg } while a reply streams

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}
function current() {
  let c = conversations.find((c) => c.id === currentId);
  if (!c) {
    c = { id: newId(), title: "New conversation", messages: [] };
    conversations.unshift(c);
    currentId = c.id;
  }
  return c;
}
function persist() {
  save(STORE.convs, conversations);
  save(STORE.current, currentId);
}

// --------------------------------------------------------------- markdown

// Escape first, then add a small set of tags to the escaped text: nothing
// the model writes can become markup it did not spell as markdown.
function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

function inline(escaped) {
  const codes = [];
  let s = escaped.replace(/`([^`\n]+)`/g, (_, c) => {
    codes.push(c);
    return "\u0000" + (codes.length - 1) + "\u0000";
  });
  s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
  s = s.replace(/(^|[^*\w])\*([^*\n]+)\*(?![*\w])/g, "$1<em>$2</em>");
  s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)"]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
  return s.replace(/\u0000(\d+)\u0000/g, (_, i) => "<code>" + codes[Number(i)] + "</code>");
}

function renderBlocks(text) {
  const out = [];
  let para = [];
  let list = null; // { tag, items }
  const flushPara = () => {
    if (para.length) out.push("<p>" + para.map(inline).join("<br>") + "</p>");
    para = [];
  };
  const flushList = () => {
    if (list) out.push("<" + list.tag + ">" + list.items.map((i) => "<li>" + inline(i) + "</li>").join("") + "</" + list.tag + ">");
    list = null;
  };
  for (const line of escapeHtml(text).split("\n")) {
    let m;
    if (/^\s*$/.test(line)) {
      flushPara();
      flushList();
    } else if ((m = /^(#{1,3})\s+(.*)$/.exec(line))) {
      flushPara();
      flushList();
      const n = m[1].length;
      out.push("<h" + n + ">" + inline(m[2]) + "</h" + n + ">");
    } else if ((m = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line))) {
      flushPara();
      const tag = m[1] ? "ol" : "ul";
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push(m[2]);
    } else {
      flushList();
      para.push(line);
    }
  }
  flushPara();
  flushList();
  return out.join("");
}

function renderMarkdown(text) {
  // Fenced code blocks first; an unclosed fence (mid-stream) runs to the end.
  const parts = [];
  const fence = /```([\w+.-]*)[^\n]*\n([\s\S]*?)(?:\n```[ \t]*(?=\n|$)|$)/g;
  let last = 0;
  let m;
  while ((m = fence.exec(text)) !== null) {
    parts.push(renderBlocks(text.slice(last, m.index)));
    const lang = m[1] ? ' data-lang="' + escapeHtml(m[1]) + '"' : "";
    parts.push("<pre" + lang + "><code>" + escapeHtml(m[2]) + "</code></pre>");
    last = fence.lastIndex;
    if (m[0].length === 0) break;
  }
  parts.push(renderBlocks(text.slice(last)));
  return parts.join("");
}

// ------------------------------------------------------------------ API

function apiKey() {
  return load(STORE.key, null);
}

let asking = null; // one key dialog for every request that got a 401

function askKey() {
  if (!asking) asking = openKeyDialog().finally(() => (asking = null));
  return asking;
}

function openKeyDialog() {
  return new Promise((resolve, reject) => {
    const dialog = $("key-dialog");
    $("key-input").value = "";
    dialog.addEventListener(
      "close",
      () => {
        const key = $("key-input").value.trim();
        if (dialog.returnValue === "ok" && key) {
          save(STORE.key, key);
          resolve(key);
        } else {
          reject(new Error("This server needs an API key."));
        }
      },
      { once: true },
    );
    dialog.showModal();
    $("key-input").focus();
  });
}

// fetch with the stored key; on 401 ask for a key and try again.
async function api(path, init = {}) {
  for (;;) {
    const headers = Object.assign({}, init.headers || {});
    const key = apiKey();
    if (key) headers["Authorization"] = "Bearer " + key;
    const res = await fetch(path, Object.assign({}, init, { headers }));
    if (res.status !== 401) return res;
    if (key) localStorage.removeItem(STORE.key);
    await askKey();
  }
}

async function errorOf(res) {
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    /* not JSON */
  }
  const e = (body && body.error) || {};
  let message = typeof e === "string" ? e : e.message || res.statusText || "request failed";
  if (!/[.!?]$/.test(message)) message += ".";
  if (res.status === 503) return "The server is at capacity (HTTP 503): " + message;
  if (e.code === "context_length_exceeded")
    return "This conversation no longer fits the model's context: " + message + " Start a new conversation, or edit an earlier message to shorten it.";
  return "Error " + res.status + ": " + message;
}

// ----------------------------------------------------------------- chat UI

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.hidden = !text;
}

function settings() {
  const s = {};
  for (const k of SETTINGS) s[k] = $(k).value;
  return s;
}

function num(v) {
  return v === "" || v === undefined || v === null ? undefined : Number(v);
}

function fmt(n, digits = 0) {
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function stick() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}
function toBottom() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function statsItems(msg) {
  const s = msg.stats;
  if (!s) return [];
  const items = [];
  if (s.completion_tokens !== undefined) items.push(["tokens", fmt(s.completion_tokens) + " tokens"]);
  if (s.ttft_ms !== undefined) items.push(["ttft", "TTFT " + fmt(s.ttft_ms) + " ms"]);
  if (s.tps !== undefined) items.push(["tps", fmt(s.tps, 1) + " tok/s"]);
  if (s.cached_tokens !== undefined) items.push(["cached", fmt(s.cached_tokens) + " cached / " + fmt(s.prompt_tokens) + " prompt"]);
  if (s.mtp) items.push(["mtp", "MTP " + fmt(100 * s.mtp.acceptance_rate, 0) + "% of " + fmt(s.mtp.drafted_tokens)]);
  if (s.stopped) items.push(["stopped", "stopped"]);
  return items;
}

function renderMessage(msg, index) {
  const el = document.createElement("article");
  el.className = "msg " + msg.role + (busy && busy.msg === msg ? " streaming" : "");
  el.dataset.index = String(index);
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = msg.role === "user" ? "You" : "Assistant";
  el.appendChild(who);

  if (msg.editing) {
    const form = document.createElement("form");
    form.className = "edit";
    const ta = document.createElement("textarea");
    ta.value = msg.content;
    ta.setAttribute("aria-label", "Edit message");
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "primary";
    save.textContent = "Save & resend";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.onclick = () => {
      msg.editing = false;
      render();
    };
    form.onsubmit = (ev) => {
      ev.preventDefault();
      msg.editing = false;
      resendFrom(index, ta.value);
    };
    ta.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        form.requestSubmit();
      }
    });
    const actions = document.createElement("div");
    actions.className = "tools";
    actions.append(save, cancel);
    form.append(ta, actions);
    el.appendChild(form);
    setTimeout(() => ta.focus(), 0);
    return el;
  }

  if (msg.reasoning) {
    const d = document.createElement("details");
    d.className = "reasoning";
    d.open = !!msg.reasoningOpen;
    d.ontoggle = () => (msg.reasoningOpen = d.open);
    const sum = document.createElement("summary");
    sum.textContent = "Reasoning";
    const body = document.createElement("div");
    body.className = "thinking";
    body.textContent = msg.reasoning;
    d.append(sum, body);
    el.appendChild(d);
  }
  const body = document.createElement("div");
  body.className = "body";
  if (msg.role === "user") {
    body.innerHTML = renderMarkdown(msg.content);
  } else {
    body.innerHTML = renderMarkdown(msg.content || "");
    for (const call of msg.tool_calls || []) {
      const t = document.createElement("div");
      t.className = "tool";
      t.textContent = "tool call → " + (call.function.name || "?") + "(" + (call.function.arguments || "") + ")";
      body.appendChild(t);
    }
    if (msg.error) {
      const e = document.createElement("div");
      e.className = "error";
      e.textContent = msg.error;
      body.appendChild(e);
    }
  }
  el.appendChild(body);

  const tools = document.createElement("div");
  tools.className = "tools";
  const button = (label, cls, fn) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = label;
    b.onclick = fn;
    tools.appendChild(b);
    return b;
  };
  if (msg.role === "user") {
    button("Edit", "edit-btn", () => {
      if (busy) return;
      msg.editing = true;
      render();
    });
  } else if (!(busy && busy.msg === msg)) {
    const copy = button("Copy", "copy-btn", async () => {
      await copyText(msg.content || "");
      copy.textContent = "Copied";
      setTimeout(() => (copy.textContent = "Copy"), 1200);
    });
    const msgs = current().messages;
    if (index === msgs.length - 1) button("Regenerate", "regen-btn", () => regenerate(index));
  }
  el.appendChild(tools);

  if (msg.role === "assistant") {
    const stats = document.createElement("div");
    stats.className = "stats";
    for (const [k, v] of statsItems(msg)) {
      const span = document.createElement("span");
      span.dataset.stat = k;
      span.textContent = v;
      stats.appendChild(span);
    }
    if (msg.stats && msg.stats.seed !== undefined) {
      const seed = document.createElement("button");
      seed.type = "button";
      seed.className = "link seed-btn";
      seed.dataset.seed = String(msg.stats.seed);
      seed.title = "Replay this answer with the same seed";
      seed.textContent = "seed " + msg.stats.seed + " ↻";
      seed.onclick = () => replay(index, msg.stats.seed);
      stats.appendChild(seed);
    }
    el.appendChild(stats);
  }
  return el;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    const ta = document.createElement("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    document.execCommand("copy");
    ta.remove();
  }
}

function renderList() {
  const ul = $("conversations");
  ul.textContent = "";
  for (const c of conversations) {
    const li = document.createElement("li");
    if (c.id === currentId) li.className = "current";
    const open = document.createElement("button");
    open.className = "open";
    open.textContent = c.title;
    open.onclick = () => {
      if (busy) stop();
      currentId = c.id;
      persist();
      render();
      $("side").classList.remove("open");
    };
    const del = document.createElement("button");
    del.className = "del";
    del.setAttribute("aria-label", "Delete conversation " + c.title);
    del.textContent = "×";
    del.onclick = () => {
      if (busy) stop();
      conversations = conversations.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = conversations.length ? conversations[0].id : null;
      persist();
      render();
    };
    li.append(open, del);
    ul.appendChild(li);
  }
}

function render() {
  const keep = stick();
  const box = $("messages");
  box.textContent = "";
  current().messages.forEach((m, i) => box.appendChild(renderMessage(m, i)));
  renderList();
  if (keep) toBottom();
  $("send").hidden = !!busy;
  $("stop").hidden = !busy;
}

// Re-render only the streaming message (cheap, no layout jump elsewhere).
function renderStreaming() {
  if (!busy) return;
  const msgs = current().messages;
  const i = msgs.indexOf(busy.msg);
  const old = $("messages").querySelector('article[data-index="' + i + '"]');
  if (!old) return;
  const keep = stick();
  old.replaceWith(renderMessage(busy.msg, i));
  if (keep) toBottom();
}

function promptMessages(upTo) {
  const out = [];
  const sys = settings().system.trim();
  if (sys) out.push({ role: "system", content: sys });
  for (const m of current().messages.slice(0, upTo)) {
    if (m.role === "assistant" && m.error && !m.content) continue;
    out.push({ role: m.role, content: m.content || "" });
  }
  return out;
}

// Stream a reply into messages[index] (an assistant message), from the
// messages before it.
async function generate(index, seedOverride) {
  const conv = current();
  const msg = conv.messages[index];
  const s = settings();
  const body = {
    messages: promptMessages(index),
    stream: true,
    stream_options: { include_usage: true },
  };
  for (const k of ["temperature", "top_p", "max_tokens", "seed", "mtp_depth"]) {
    const v = num(s[k]);
    if (v !== undefined && !Number.isNaN(v)) body[k] = v;
  }
  if (seedOverride !== undefined) body.seed = seedOverride;
  const controller = new AbortController();
  busy = { controller, msg };
  notice("");
  render();
  toBottom();
  const t0 = performance.now();
  let tFirst = null;
  let dirty = false;
  const flush = () => {
    if (dirty) {
      dirty = false;
      renderStreaming();
    }
  };
  const timer = setInterval(flush, 50);
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) {
      const text = await errorOf(res);
      msg.error = text;
      notice(text);
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    const calls = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart())
          .join("\n");
        if (!data || data === "[DONE]") continue;
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch (_) {
          continue;
        }
        if (chunk.error) {
          msg.error = "Error: " + (chunk.error.message || JSON.stringify(chunk.error));
          dirty = true;
          continue;
        }
        const choice = chunk.choices && chunk.choices[0];
        const delta = (choice && choice.delta) || {};
        if (delta.content || delta.reasoning_content || delta.tool_calls) {
          if (tFirst === null) tFirst = performance.now();
        }
        if (delta.reasoning_content) msg.reasoning = (msg.reasoning || "") + delta.reasoning_content;
        if (delta.content) msg.content += delta.content;
        for (const tc of delta.tool_calls || []) {
          const i = tc.index || 0;
          calls[i] = calls[i] || { id: tc.id, type: "function", function: { name: "", arguments: "" } };
          if (tc.id) calls[i].id = tc.id;
          if (tc.function && tc.function.name) calls[i].function.name += tc.function.name;
          if (tc.function && tc.function.arguments) calls[i].function.arguments += tc.function.arguments;
          msg.tool_calls = calls.filter(Boolean);
        }
        if (chunk.usage) {
          const u = chunk.usage;
          const t = u.timings || {};
          const end = performance.now();
          msg.stats = Object.assign({}, msg.stats, {
            completion_tokens: u.completion_tokens,
            prompt_tokens: u.prompt_tokens,
            cached_tokens: (u.prompt_tokens_details || {}).cached_tokens || 0,
            seed: u.seed,
            ttft_ms: tFirst === null ? end - t0 : tFirst - t0,
            tps: t.decode_ms > 0 ? (1000 * t.decode_tokens) / t.decode_ms : tFirst !== null && end > tFirst ? (1000 * u.completion_tokens) / (end - tFirst) : 0,
            mtp: u.mtp || null,
          });
        }
        dirty = true;
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      msg.stats = Object.assign({}, msg.stats, { stopped: true });
      if (tFirst !== null) msg.stats.ttft_ms = tFirst - t0;
    } else {
      msg.error = e.message || String(e);
      notice(msg.error);
    }
  } finally {
    clearInterval(timer);
    busy = null;
    if (conv.title === "New conversation") {
      const first = conv.messages.find((m) => m.role === "user");
      if (first) conv.title = first.content.slice(0, 48) || "Conversation";
    }
    persist();
    render();
  }
}

function stop() {
  if (busy) busy.controller.abort();
}

function send(text) {
  if (busy || !text.trim()) return;
  const conv = current();
  conv.messages.push({ role: "user", content: text });
  conv.messages.push({ role: "assistant", content: "" });
  persist();
  return generate(conv.messages.length - 1);
}

function regenerate(index, seed) {
  if (busy) return;
  const conv = current();
  conv.messages.splice(index);
  conv.messages.push({ role: "assistant", content: "" });
  return generate(index, seed);
}

function replay(index, seed) {
  return regenerate(index, seed);
}

function resendFrom(index, text) {
  if (busy) return;
  const conv = current();
  conv.messages[index].content = text;
  conv.messages.splice(index + 1);
  conv.messages.push({ role: "assistant", content: "" });
  persist();
  return generate(index + 1);
}

// -------------------------------------------------------------- dashboard

const series = { decode: [], prefill: [], mtp: [] };
let dashTimer = null;
let lastTurns = -1;

function bytes(n) {
  if (n >= 1 << 30) return fmt(n / (1 << 30), 2) + " GiB";
  if (n >= 1 << 20) return fmt(n / (1 << 20), 1) + " MiB";
  if (n >= 1 << 10) return fmt(n / (1 << 10), 1) + " KiB";
  return fmt(n) + " B";
}

function card(title, rows) {
  const c = document.createElement("div");
  c.className = "card";
  const h = document.createElement("h3");
  h.textContent = title;
  const dl = document.createElement("dl");
  for (const [key, label, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.dataset.k = key;
    dd.textContent = value;
    dl.append(dt, dd);
  }
  c.append(h, dl);
  return c;
}

function chart(id, values) {
  const svg = $(id);
  svg.textContent = "";
  if (values.length < 2) return;
  const max = Math.max(1e-9, ...values);
  const step = 300 / (values.length - 1);
  const pts = values.map((v, i) => (i * step).toFixed(1) + "," + (78 - (76 * v) / max).toFixed(1)).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts);
  svg.appendChild(line);
}

function renderStatus(s) {
  const cache = s.cache;
  const sp = s.speed;
  const avg = (t, secs) => (secs > 0 ? fmt(t / secs, 1) : "–");
  const cards = [
    card("Model", [
      ["model", "model", s.model],
      ["family", "family", s.family],
      ["backend", "backend", s.backend + " (" + s.kernel_set + " kernels, " + s.kv_cache + " KV cache)"],
      ["sampling_law", "sampling law", s.sampling_law],
      ["defaults", "defaults", "T " + s.sampling_defaults.temperature + " · top-p " + s.sampling_defaults.top_p + " · top-k " + s.sampling_defaults.top_k + " · min-p " + s.sampling_defaults.min_p],
      ["context_length", "context", fmt(s.context_length) + " tokens"],
      ["uptime", "uptime", fmt(s.uptime_seconds) + " s"],
    ]),
    card("Queue", [
      ["running", "running", fmt(s.running) + " of " + fmt(s.lanes) + " lanes"],
      ["queue_depth", "waiting", fmt(s.queue_depth) + (s.max_queue === null ? "" : " / " + fmt(s.max_queue))],
      ["queue_tokens", "queued tokens", fmt(s.queue.reserved_tokens) + " / " + fmt(s.queue.max_tokens)],
      ["requests", "requests", fmt(s.totals.requests)],
      ["turns", "turns", fmt(s.totals.turns)],
      ["cancelled", "cancelled", fmt(s.totals.turns_cancelled)],
      ["rejected", "refused (busy / too long)", fmt(s.totals.rejected_queue_full) + " / " + fmt(s.totals.rejected_context_length)],
      ["errors", "errors 4xx / 5xx", fmt(s.totals.errors_4xx) + " / " + fmt(s.totals.errors_5xx)],
    ]),
    card("Session cache", [
      ["live_tokens", "live session", fmt(cache.live_session.tokens) + " tokens"],
      ["live_bytes", "live bytes", bytes(cache.live_session.bytes)],
      ["bank_sessions", "bank", fmt(cache.bank.sessions) + " sessions"],
      ["bank_bytes", "bank bytes", bytes(cache.bank.bytes) + " / " + bytes(cache.bank.budget_bytes)],
      ["checkpoints", "checkpoints", cache.checkpoints ? fmt(cache.checkpoints.files) + " files, " + bytes(cache.checkpoints.bytes) + " / " + bytes(cache.checkpoints.budget_bytes) : "off"],
    ]),
    card("Cache hits", [
      ["hits_live", "live", fmt(cache.hits.live)],
      ["hits_bank", "bank", fmt(cache.hits.bank)],
      ["hits_disk", "disk", fmt(cache.hits.disk)],
      ["misses", "misses", fmt(cache.misses)],
      ["cached_tokens", "tokens reused", fmt(s.totals.cached_prompt_tokens) + " of " + fmt(s.totals.prompt_tokens)],
    ]),
    card("Speed", [
      ["last_prefill", "prefill, last turn", fmt(sp.last_prefill_tokens_per_second, 1) + " tok/s"],
      ["last_decode", "decode, last turn", fmt(sp.last_decode_tokens_per_second, 1) + " tok/s"],
      ["avg_prefill", "prefill, overall", avg(sp.prefill_tokens, sp.prefill_seconds) + " tok/s"],
      ["avg_decode", "decode, overall", avg(sp.decode_tokens, sp.decode_seconds) + " tok/s"],
      ["tokens_per_second", "now (last 10 s)", fmt(sp.tokens_per_second, 1) + " tok/s"],
      ["ttft", "time to first token (mean)", s.latency.turns ? fmt(s.latency.mean_time_to_first_token_seconds, 2) + " s" : "–"],
      ["batch", "batch size (mean / largest)", s.batching.batches ? fmt(s.batching.mean_size, 2) + " / " + fmt(s.batching.largest) : "–"],
      ["completion_tokens", "generated", fmt(s.totals.completion_tokens) + " tokens"],
    ]),
    card(
      "MTP",
      s.mtp
        ? [
            ["mtp_depth", "depth (default / max)", s.mtp.default_depth + " / " + s.mtp.max_depth],
            ["mtp_acceptance", "acceptance", s.mtp.drafted_tokens ? fmt((100 * s.mtp.accepted_tokens) / s.mtp.drafted_tokens, 1) + "%" : "–"],
            ["mtp_drafted", "drafted", fmt(s.mtp.drafted_tokens)],
          ]
        : [["mtp_depth", "head", "none (autoregressive)"]],
    ),
  ];
  $("dash-cards").replaceChildren(...cards);
  if (s.totals.turns !== lastTurns) {
    lastTurns = s.totals.turns;
    const push = (arr, v) => {
      arr.push(v);
      if (arr.length > 60) arr.shift();
    };
    push(series.decode, sp.last_decode_tokens_per_second);
    push(series.prefill, sp.last_prefill_tokens_per_second);
    push(series.mtp, s.mtp && s.mtp.drafted_tokens ? s.mtp.accepted_tokens / s.mtp.drafted_tokens : 0);
    chart("chart-decode", series.decode);
    chart("chart-prefill", series.prefill);
    chart("chart-mtp", series.mtp);
  }
  $("dash-updated").textContent = "Updated " + new Date().toLocaleTimeString();
}

async function status() {
  const res = await api("/v1/status");
  if (!res.ok) throw new Error(await errorOf(res));
  return res.json();
}

async function pollStatus() {
  try {
    renderStatus(await status());
  } catch (e) {
    $("dash-updated").textContent = e.message || String(e);
  }
}

// ------------------------------------------------------------------ views

function show(view) {
  const dash = view === "dashboard";
  $("view-chat").hidden = dash;
  $("view-dashboard").hidden = !dash;
  $("side").hidden = dash;
  $("menu").hidden = dash;
  for (const a of document.querySelectorAll(".tabs a")) {
    if (a.dataset.view === view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  clearInterval(dashTimer);
  dashTimer = null;
  if (dash) {
    pollStatus();
    dashTimer = setInterval(pollStatus, 1000);
  } else {
    $("input").focus();
  }
}

function viewOf(path) {
  return path.replace(/\/+$/, "") === "/dashboard" ? "dashboard" : "chat";
}

function init() {
  const saved = load(STORE.settings, {});
  for (const k of SETTINGS) {
    if (saved[k] !== undefined) $(k).value = saved[k];
    $(k).addEventListener("change", () => save(STORE.settings, settings()));
  }
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value;
    if (!text.trim() || busy) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && busy) {
      ev.preventDefault();
      stop();
    }
  });
  $("stop").onclick = stop;
  $("new-chat").onclick = () => {
    if (busy) stop();
    const c = { id: newId(), title: "New conversation", messages: [] };
    conversations.unshift(c);
    currentId = c.id;
    persist();
    render();
    $("input").focus();
  };
  $("forget-key").onclick = () => localStorage.removeItem(STORE.key);
  $("menu").onclick = () => {
    const open = $("side").classList.toggle("open");
    $("menu").setAttribute("aria-expanded", String(open));
  };
  for (const a of document.querySelectorAll(".tabs a")) {
    a.addEventListener("click", (ev) => {
      ev.preventDefault();
      navigate(a.getAttribute("href"));
      show(a.dataset.view);
    });
  }
  window.addEventListener("popstate", () => show(viewOf(location.pathname)));
  render();
  show(viewOf(location.pathname));
  status()
    .then((s) => ($("model").textContent = s.model + " · " + s.family + " · " + s.sampling_law + " · " + s.backend))
    .catch((e) => notice(e.message || String(e)));
}

function navigate(path) {
  if (location.pathname !== path) window.history.pushState({}, "", path);
}

// For the browser tests: the page's own state, read-only.
window.ds4 = { conversations: () => conversations, busy: () => !!busy };

init();
