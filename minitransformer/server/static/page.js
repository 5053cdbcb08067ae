// The live page: a prompt streamed through the OpenAI endpoints, and the engine's state from /v1/engine/events.
// Plain JavaScript, no library. Everything the model wrote reaches the page through textContent / text nodes,
// never as HTML: a reply that contains "<script>" shows those characters.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const STEPS_SHOWN = 160;              // bars in the step timeline
  const RATE_WINDOW_S = 2;              // output tok/s is measured over this much of the engine's clock

  const view = {
    labels: new Map(),                  // request id -> "#n", numbered as the page first sees it
    nextLabel: 1,
    mine: null,                         // the request id of the reply panel's request
    peakRunning: 0,
    steps: [],                          // step records, oldest first
    rates: [],                          // [engine time, tokens sampled so far]
    blockSize: 16,
    maxModelLen: 2048,
  };

  // -------------------------------------------------------------------------------- HTTP helpers

  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    const key = $("api-key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // The `data:` payloads of a server-sent-event stream read with fetch (EventSource cannot send a key).
  async function* sseData(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
        if (data.length) yield data.join("\n");
      }
    }
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  function needKey() {
    $("key-row").hidden = false;
  }

  const ms = (s) => (s == null ? "–" : (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms");
  const bareId = (chunkId) => String(chunkId || "").replace(/^(chatcmpl|cmpl)-/, "");
  const label = (id) => {
    if (!view.labels.has(id)) view.labels.set(id, "#" + view.nextLabel++);
    return view.labels.get(id);
  };

  function sampling() {
    const number = (id, fallback) => {
      const v = parseFloat($(id).value);
      return Number.isFinite(v) ? v : fallback;
    };
    const body = { temperature: number("temperature", 0), top_p: number("top-p", 1),
                   top_k: Math.trunc(number("top-k", 0)) };
    const stop = $("stop").value;
    if (stop) body.stop = [stop];
    return body;
  }

  // -------------------------------------------------------------------------------- one streamed reply

  let replyAbort = null;

  async function sendPrompt(event) {
    event.preventDefault();
    if (replyAbort) return;
    const chat = $("chat").checked;
    const text = $("prompt").value;
    const body = { ...sampling(), max_tokens: Math.max(1, Math.trunc(+$("max-tokens").value || 16)),
                   stream: true, stream_options: { include_usage: true }, return_token_ids: true };
    if (chat) Object.assign(body, { messages: [{ role: "user", content: text }], logprobs: true, top_logprobs: 5 });
    else Object.assign(body, { prompt: text, logprobs: 5 });
    const reply = $("reply-text"), chips = $("chips"), status = $("reply-status");
    reply.textContent = "";
    chips.textContent = "";
    setStatus(status, "waiting", "Sent; waiting for the first token (queue + prefill)…");
    replyAbort = new AbortController();
    $("send").disabled = true;
    $("cancel").disabled = false;
    const latencies = [];
    let usage = null, finish = null;
    const start = performance.now();
    let last = start;
    try {
      const response = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
        method: "POST", headers: headers(true), body: JSON.stringify(body), signal: replyAbort.signal });
      if (response.status === 401) needKey();
      if (!response.ok) throw new Error(await errorText(response));
      for await (const data of sseData(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        view.mine = bareId(chunk.id);
        const delta = chat ? (choice.delta && choice.delta.content) || "" : choice.text || "";
        if (delta) reply.append(delta);                        // a text node: never parsed as HTML
        const ids = choice.token_ids || [];
        const tokens = tokenEntries(choice.logprobs, chat);
        const now = performance.now();
        for (let i = 0; i < ids.length; i++) {
          const latency = (now - last) / ids.length / 1000;
          latencies.push(latency);
          chips.append(makeChip(ids[i], tokens[i], latency, latencies.length === 1));
        }
        if (ids.length) last = now;
        if (choice.finish_reason) finish = choice.finish_reason;
        shadeChips(latencies);
        if (latencies.length) {
          setStatus(status, "streaming", `Streaming: ${latencies.length} tokens, TTFT ${ms(latencies[0])}` +
                    (view.mine ? `, request ${label(view.mine)}` : ""));
        }
      }
      const itls = latencies.slice(1);
      const itl = itls.length ? itls.reduce((a, b) => a + b, 0) / itls.length : null;
      setStatus(status, "done", `Done: ${usage ? usage.completion_tokens : latencies.length} tokens ` +
                `(prompt ${usage ? usage.prompt_tokens : "?"}), finish_reason ${finish}, TTFT ${ms(latencies[0])}, ` +
                `mean ITL ${ms(itl)}, total ${ms((performance.now() - start) / 1000)}.`);
    } catch (error) {
      if (error.name === "AbortError") setStatus(status, "done", "Stopped: the server aborted the request.");
      else setStatus(status, "error", "Error: " + error.message);
    } finally {
      replyAbort = null;
      $("send").disabled = false;
      $("cancel").disabled = true;
    }
  }

  function setStatus(element, state, text) {
    element.dataset.state = state;
    element.textContent = text;
  }

  // Completions and chat report logprobs in two shapes; both become {piece, logprob, top: [[piece, logprob]]}.
  function tokenEntries(logprobs, chat) {
    if (!logprobs) return [];
    if (chat) {
      return (logprobs.content || []).map((t) => ({
        piece: t.token, logprob: t.logprob, top: (t.top_logprobs || []).map((a) => [a.token, a.logprob]) }));
    }
    return (logprobs.tokens || []).map((piece, i) => ({
      piece, logprob: logprobs.token_logprobs[i], top: Object.entries((logprobs.top_logprobs || [])[i] || {}) }));
  }

  const visible = (piece) => (piece === "" ? "∅" : piece.replace(/\n/g, "⏎").replace(/\t/g, "⇥"));

  function makeChip(id, entry, latency, first) {
    const chip = document.createElement("span");
    chip.className = first ? "chip ttft" : "chip";
    chip.tabIndex = 0;
    chip.textContent = visible(entry ? entry.piece : "?");
    chip.dataset.tokenId = id;
    chip.dataset.latency = latency;
    chip.setAttribute("aria-describedby", "tooltip");
    chip.details = { id, entry, latency, first };
    chip.addEventListener("mouseenter", () => showTooltip(chip));
    chip.addEventListener("focus", () => showTooltip(chip));
    chip.addEventListener("mouseleave", hideTooltip);
    chip.addEventListener("blur", hideTooltip);
    return chip;
  }

  // Shade the inter-token chips from the fastest to the slowest of this reply; the TTFT chip stands apart.
  function shadeChips(latencies) {
    const itls = latencies.slice(1);
    if (!itls.length) return;
    const lo = Math.min(...itls), hi = Math.max(...itls);
    $("scale-min").textContent = ms(lo);
    $("scale-max").textContent = ms(hi);
    for (const chip of $("chips").querySelectorAll(".chip:not(.ttft)")) {
      const t = hi > lo ? (chip.details.latency - lo) / (hi - lo) : 0;
      chip.style.backgroundColor = `hsl(214, 75%, ${90 - 55 * t}%)`;
      chip.style.color = t > 0.55 ? "#fff" : "";
    }
  }

  function showTooltip(chip) {
    const { id, entry, latency, first } = chip.details;
    const tip = $("tooltip");
    tip.textContent = "";
    const line = (text) => tip.append(text, document.createElement("br"));
    line(`token ${JSON.stringify(entry ? entry.piece : "?")}  id ${id}`);
    if (entry) line(`logprob ${entry.logprob.toFixed(3)}  (p = ${(100 * Math.exp(entry.logprob)).toFixed(1)}%)`);
    line(`${first ? "TTFT" : "ITL"} ${ms(latency)}`);
    if (entry && entry.top.length) {
      tip.append("top alternatives:");
      const table = document.createElement("table");
      for (const [piece, lp] of entry.top) {
        const row = table.insertRow();
        if (piece === entry.piece) row.className = "chosen";
        row.insertCell().textContent = JSON.stringify(piece);
        row.insertCell().textContent = lp.toFixed(3);
        row.insertCell().textContent = (100 * Math.exp(lp)).toFixed(1) + "%";
      }
      tip.append(table);
    }
    tip.hidden = false;
    const box = chip.getBoundingClientRect();
    const left = Math.min(box.left, window.innerWidth - tip.offsetWidth - 8);
    const below = box.bottom + 6 + tip.offsetHeight < window.innerHeight;
    tip.style.left = Math.max(4, left) + "px";
    tip.style.top = (below ? box.bottom + 6 : Math.max(4, box.top - tip.offsetHeight - 6)) + "px";
  }

  function hideTooltip() {
    $("tooltip").hidden = true;
  }

  // -------------------------------------------------------------------------------- 16 requests at once

  const SHARED = "You are a patient teacher. Explain every idea with one short example, in plain words, " +
    "and keep each answer under a few sentences. Here is the question: ";
  const TOPICS = ["why the sky is blue", "how a bicycle stays up", "what a prime number is", "how bread rises",
                  "why ice floats", "how a compass works", "what an echo is", "why leaves change colour"];
  const STORY = "Once upon a time a small robot lived in a lighthouse by the sea. Every night it counted the ships, " +
    "polished the great lamp and wrote the weather in a notebook. One winter a storm broke the lamp, and the robot " +
    "had to find a way to guide the last fishing boat home before morning came over the grey water.";
  const MAX_TOKENS = [8, 48, 16, 64, 24, 12, 40, 32];

  function burstRequests() {
    // Lengths scale with the model's context, so the same button works on a 128-token test model.
    const budget = Math.max(12, Math.min(600, Math.floor(view.maxModelLen * 0.4)));   // characters
    const room = Math.max(1, view.maxModelLen - budget - 8);
    const requests = [];
    for (let i = 0; i < 16; i++) {
      let prompt;
      if (i % 2 === 0) prompt = (SHARED.slice(0, Math.floor(budget * 0.7)) + TOPICS[i / 2]).slice(0, budget);
      else prompt = STORY.slice(0, Math.max(4, Math.floor(budget * (0.15 + 0.12 * ((i * 5) % 8)))));
      requests.push({ prompt, max_tokens: Math.min(MAX_TOKENS[i % 8], room) });
    }
    return requests;
  }

  async function burst() {
    const button = $("burst"), status = $("burst-status");
    button.disabled = true;
    const counts = { waiting: 16, streaming: 0, done: 0, failed: 0 };
    const show = () => { status.textContent = `16 requests: ${counts.waiting} waiting for a first token, ` +
      `${counts.streaming} streaming, ${counts.done} done` + (counts.failed ? `, ${counts.failed} refused` : ""); };
    show();
    const one = async (request) => {
      let started = false;
      try {
        const response = await fetch("/v1/completions", { method: "POST", headers: headers(true),
          body: JSON.stringify({ ...sampling(), ...request, stream: true }) });
        if (response.status === 401) needKey();
        if (!response.ok) throw new Error(await errorText(response));
        for await (const data of sseData(response)) {
          if (data === "[DONE]") break;
          if (!started) { started = true; counts.waiting--; counts.streaming++; show(); }
        }
        counts.done++;
      } catch (error) {
        counts.failed++;
        status.title = error.message;
      }
      if (started) counts.streaming--;
      else counts.waiting--;
      show();
    };
    await Promise.all(burstRequests().map(one));
    button.disabled = false;
  }

  // -------------------------------------------------------------------------------- the engine panel

  async function watchEngine() {
    const connection = $("connection");
    for (;;) {
      try {
        const response = await fetch("/v1/engine/events", { headers: headers(false) });
        if (response.status === 401) {
          needKey();
          setStatus(connection, "error", "enter the API key to watch the engine");
          await keyChanged();
          continue;
        }
        if (!response.ok) throw new Error(await errorText(response));
        setStatus(connection, "live", "live");
        for await (const data of sseData(response)) render(JSON.parse(data));
        setStatus(connection, "error", "engine stream ended; reconnecting");
      } catch (error) {
        setStatus(connection, "error", "not connected (" + error.message + "); retrying");
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }

  const keyChanged = () => new Promise((resolve) => $("api-key").addEventListener("change", resolve, { once: true }));

  function render(state) {
    const cfg = state.config;
    view.blockSize = cfg.block_size;
    view.maxModelLen = cfg.max_model_len;
    $("model-line").textContent = `${state.model} · KV pool ${cfg.num_blocks} blocks × ${cfg.block_size} tokens · ` +
      `at most ${cfg.max_num_seqs} running · ${cfg.policy} batching · step ${state.step}`;
    for (const el of document.querySelectorAll(".cfg-seqs")) el.textContent = cfg.max_num_seqs;
    for (const el of document.querySelectorAll(".cfg-block")) el.textContent = cfg.block_size;
    for (const s of state.running.concat(state.waiting)) if (s.id !== null) label(s.id);
    renderCounters(state);
    renderQueue($("running-list"), state.running, "nothing running");
    renderQueue($("waiting-list"), state.waiting, "nobody waiting");
    renderPool(state);
    renderTables(state);
    view.steps = view.steps.concat(state.steps).slice(-STEPS_SHOWN);
    drawTimeline();
  }

  function renderCounters(state) {
    const s = state.stats;
    view.peakRunning = Math.max(view.peakRunning, state.running.length);
    $("c-running").textContent = state.running.length;
    $("c-waiting").textContent = state.waiting.length;
    $("c-peak").textContent = view.peakRunning;
    const used = s.num_blocks - s.num_free_blocks;
    $("c-kv").textContent = `${used} / ${s.num_blocks} (${Math.round((100 * used) / s.num_blocks)}%)`;
    if (s.num_generation_tokens == null) {            // a tenant's view: the engine-wide totals are the operator's
      $("c-tps").textContent = "–";
    } else {
      view.rates.push([state.time, s.num_generation_tokens]);
      view.rates = view.rates.filter(([t]) => t >= state.time - RATE_WINDOW_S);
      const [t0, n0] = view.rates[0];
      $("c-tps").textContent = state.time > t0 && state.running.length ? ((s.num_generation_tokens - n0) /
        (state.time - t0)).toFixed(0) : "–";
    }
    const ttfts = state.finished.map((f) => f.ttft_s).filter((x) => x != null).sort((a, b) => a - b);
    const itls = state.finished.map((f) => f.itl_s).filter((x) => x != null);
    $("c-ttft").textContent = ttfts.length ? ms(ttfts[Math.floor((ttfts.length - 1) / 2)]) : "–";
    $("c-itl").textContent = itls.length ? ms(itls.reduce((a, b) => a + b, 0) / itls.length) : "–";
    $("c-preempt").textContent = s.num_preemptions == null ? "–" : s.num_preemptions;
    $("c-prefix").textContent = s.prefix_cache_queries ?
      `${Math.round((100 * s.prefix_cache_hits) / s.prefix_cache_queries)}%` : "–";
    $("c-prefix").title = `${s.prefix_cache_hits} of ${s.prefix_cache_queries} prompt tokens looked up were cached`;
  }

  function renderQueue(list, seqs, emptyText) {
    list.textContent = "";
    if (!seqs.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = emptyText;
      list.append(li);
      return;
    }
    for (const s of seqs) {
      if (s.id === null) {                  // another tenant's request: only that it is there, and its blocks
        const li = document.createElement("li");
        li.className = s.status + " other";
        li.textContent = `another tenant's request, ${s.num_blocks} blocks`;
        list.append(li);
        continue;
      }
      const li = document.createElement("li");
      li.className = s.status + (s.id === view.mine ? " mine" : "");
      li.dataset.requestId = s.id;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = label(s.id);
      const bar = document.createElement("span");
      bar.className = "bar";
      const total = s.prompt_tokens + s.max_tokens;
      for (const [cls, n] of [["p", s.prompt_tokens + s.output_tokens], ["o", s.output_tokens]]) {
        const part = document.createElement("span");
        part.className = cls;
        part.style.width = (100 * n) / total + "%";
        if (cls === "o") part.style.left = (100 * s.prompt_tokens) / total + "%";
        bar.append(part);
      }
      const counts = document.createElement("span");
      counts.textContent = `${s.prompt_tokens} + ${s.output_tokens}` + (s.status === "preempted" ? " ⟲" : "");
      li.title = `${label(s.id)} ${s.status}: prompt ${s.prompt_tokens} tokens, output ${s.output_tokens} of at ` +
        `most ${s.max_tokens}, ${s.computed_tokens} in the KV cache, ${s.blocks.length} blocks, preempted ` +
        `${s.preemptions} times` + (s.ttft_s != null ? `, TTFT ${ms(s.ttft_s)}` : "");
      li.append(name, bar, counts);
      if (s.id === view.mine) {
        const tag = document.createElement("span");
        tag.className = "mine-tag";
        tag.textContent = "you";
        name.append(" ", tag);
      }
      list.append(li);
    }
  }

  const STATES = { ".": "free", u: "used", s: "shared", c: "cached" };

  function renderPool(state) {
    const pool = $("pool");
    if (pool.children.length !== state.pool.length) {
      pool.textContent = "";
      pool.classList.toggle("dense", state.pool.length > 256);      // a big pool still fits on one screen
      for (let b = 0; b < state.pool.length; b++) {
        const cell = document.createElement("span");
        cell.className = "block";
        pool.append(cell);
      }
    }
    const owners = new Map();
    for (const s of state.running.concat(state.waiting)) {
      if (s.id === null) continue;          // another tenant's: its blocks are not shown
      for (const b of s.blocks) owners.set(b, (owners.get(b) || []).concat(label(s.id)));
    }
    const cells = pool.children;
    for (let b = 0; b < state.pool.length; b++) {
      const cell = cells[b], kind = STATES[state.pool[b]];
      if (cell.dataset.state !== kind) cell.dataset.state = kind;
      const who = owners.get(b);
      const title = `block ${b}: ${kind}` + (who ? ` (${who.join(", ")})` : "");
      if (cell.title !== title) cell.title = title;
    }
    const used = [...state.pool].filter((c) => c === "u" || c === "s").length;
    pool.setAttribute("aria-label", `KV block pool: ${used} of ${state.pool.length} blocks in use`);
  }

  function renderTables(state) {
    const tables = $("tables");
    tables.textContent = "";
    if (!state.running.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "no running request holds blocks";
      tables.append(p);
    }
    for (const s of state.running) {
      if (s.id === null) continue;
      const row = document.createElement("div");
      row.className = "row";
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = label(s.id);
      row.append(name);
      for (const b of s.blocks) {
        const cell = document.createElement("span");
        cell.className = "cell" + (state.pool[b] === "s" ? " shared" : "");
        cell.textContent = b;
        row.append(cell);
      }
      tables.append(row);
    }
  }

  function drawTimeline() {
    const canvas = $("timeline");
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const steps = view.steps;
    if (!steps.length) return;
    // a tenant's view has no token counts (the others' traffic): its bars are the requests each step ran
    const counted = (s) => (s.prefill_tokens == null ? s.num_seqs : s.prefill_tokens + s.decode_tokens);
    const top = Math.max(...steps.map(counted), 1);
    const scale = (n) => (height - 14) * Math.sqrt(n / top);
    const bar = width / STEPS_SHOWN;
    steps.forEach((s, i) => {
      const x = width - (steps.length - i) * bar;
      const decode = scale(s.decode_tokens == null ? counted(s) : s.decode_tokens), both = scale(counted(s));
      ctx.fillStyle = "#3d7be0";
      ctx.fillRect(x, height - decode, Math.max(1, bar - 1), decode);
      ctx.fillStyle = "#f0932b";
      ctx.fillRect(x, height - both, Math.max(1, bar - 1), both - decode);
      if (s.preempted) {
        ctx.fillStyle = "#d93b3b";
        ctx.fillRect(x, 0, Math.max(2, bar - 1), 8);
      }
    });
    ctx.fillStyle = "#5b6475";
    ctx.font = "11px system-ui, sans-serif";
    const last = steps[steps.length - 1];
    ctx.fillText(last.prefill_tokens == null ? `${top} requests` : `${top} tokens`, 4, 11);
    $("timeline-note").textContent = last.prefill_tokens == null
      ? `Last step: ${last.num_seqs} requests in ${ms(last.duration_s)}.`
      : `Last step: ${last.num_seqs} requests, ${last.prefill_tokens} prompt + ` +
        `${last.decode_tokens} decode tokens in ${ms(last.duration_s)}.`;
    canvas.setAttribute("aria-label", `step timeline: ${steps.length} recent steps; ${$("timeline-note").textContent}`);
  }

  // -------------------------------------------------------------------------------- start

  $("prompt-form").addEventListener("submit", sendPrompt);
  $("cancel").addEventListener("click", () => replyAbort && replyAbort.abort());
  $("burst").addEventListener("click", burst);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("prompt-form").requestSubmit();
  });
  window.addEventListener("resize", drawTimeline);
  watchEngine();
})();
