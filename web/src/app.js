// web/src/app.js — the chat page: conversations kept in localStorage, answers streamed from
// POST /v1/chat/completions and rendered as sanitized Markdown, the server's /stats in a panel.
import { marked } from 'marked';
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/common';

const STORE_KEY = 'inferd.conversations';
const CURRENT_KEY = 'inferd.current';
const SETTINGS_KEY = 'inferd.settings';
const API_KEY = 'inferd.apiKey';
const STATS_EVERY_MS = 2000;

const $ = (id) => document.getElementById(id);
const els = {
  messages: $('messages'), prompt: $('prompt'), composer: $('composer'), send: $('send'), stop: $('stop'),
  model: $('model'), conversations: $('conversations'), newChat: $('new-chat'), exportChat: $('export-chat'),
  sidebar: $('sidebar'), settings: $('settings'), stats: $('stats'), statsList: $('stats-list'),
  toggleSidebar: $('toggle-sidebar'), toggleSettings: $('toggle-settings'), toggleStats: $('toggle-stats'),
  system: $('system'), temperature: $('temperature'), temperatureValue: $('temperature-value'),
  maxTokens: $('max-tokens'), thinking: $('thinking'),
  keyDialog: $('key-dialog'), keyForm: $('key-form'), apiKey: $('api-key'), rememberKey: $('remember-key'),
};

// ---- storage ----

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v ? JSON.parse(v) : fallback;
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch {
    // A full or disabled storage loses history, not the page.
  }
}

const state = {
  conversations: load(STORE_KEY, []),
  current: load(CURRENT_KEY, null),
  model: null,
  abort: null, // the AbortController of the answer under way
  statsTimer: null,
  key: sessionStorage.getItem(API_KEY) || localStorage.getItem(API_KEY) || '',
  keyWaiters: [],
};

function persist() {
  save(STORE_KEY, state.conversations);
  save(CURRENT_KEY, state.current);
}

function newId() {
  const a = new Uint8Array(8);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, '0')).join('');
}

function currentConversation() {
  let c = state.conversations.find((x) => x.id === state.current);
  if (!c) {
    c = { id: newId(), title: 'New chat', created: Date.now(), messages: [] };
    state.conversations.unshift(c);
    state.current = c.id;
    persist();
  }
  return c;
}

// ---- settings ----

function loadSettings() {
  const s = load(SETTINGS_KEY, {});
  if (typeof s.system === 'string') els.system.value = s.system;
  if (typeof s.temperature === 'number') els.temperature.value = String(s.temperature);
  if (typeof s.maxTokens === 'number') els.maxTokens.value = String(s.maxTokens);
  if (typeof s.thinking === 'boolean') els.thinking.checked = s.thinking;
  els.temperatureValue.textContent = els.temperature.value;
}

function saveSettings() {
  els.temperatureValue.textContent = els.temperature.value;
  save(SETTINGS_KEY, {
    system: els.system.value,
    temperature: Number(els.temperature.value),
    maxTokens: Number(els.maxTokens.value),
    thinking: els.thinking.checked,
  });
}

// ---- rendering ----

const escapeHtml = (s) =>
  String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

// HTML the model writes is shown as the text it is, never parsed; a Markdown image shows its
// alt text (loading it would be a request to wherever the model points).
marked.use({
  gfm: true,
  breaks: false,
  renderer: {
    html: (token) => escapeHtml(token.text),
    image: (token) => escapeHtml(token.text ? `[image: ${token.text}]` : '[image]'),
  },
});

// Defence in depth: whatever markup gets through is inert before it reaches the page.
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'IMG' && !/^data:/i.test(node.getAttribute('src') || '')) node.removeAttribute('src');
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('rel', 'noopener noreferrer nofollow');
    node.setAttribute('target', '_blank');
  }
});

// Model output is untrusted: Markdown to HTML (raw HTML escaped), then DOMPurify keeps only
// inert markup (no scripts, no event handlers, no javascript: URLs, no inline styles the CSP
// would refuse).
function renderMarkdown(target, text) {
  const html = marked.parse(text || '');
  target.innerHTML = DOMPurify.sanitize(html, {
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select'],
    FORBID_ATTR: ['style'],
    ADD_ATTR: ['target'],
  });
  for (const code of target.querySelectorAll('pre code')) hljs.highlightElement(code);
}

function button(label, onClick, aria) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  if (aria) b.setAttribute('aria-label', aria);
  b.addEventListener('click', onClick);
  return b;
}

function formatMeta(stats) {
  if (!stats) return '';
  const parts = [];
  if (stats.completion_tokens != null) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.tokens_per_s) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  if (stats.ttft_ms != null) parts.push(`first token ${Math.round(stats.ttft_ms)} ms`);
  if (stats.cached_tokens != null) parts.push(`cached_tokens ${stats.cached_tokens}`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(' · ');
}

function renderToolCalls(container, calls) {
  for (const call of calls || []) {
    const box = document.createElement('div');
    box.className = 'tool-call';
    const name = document.createElement('span');
    name.className = 'tool-name';
    name.textContent = `Tool call: ${call.function?.name || '?'}`;
    const args = document.createElement('pre');
    args.textContent = call.function?.arguments || '';
    box.append(name, args);
    container.append(box);
  }
}

// One message's element: who, reasoning fold-out, body, tool calls, meta and actions.
function messageElement(conv, index) {
  const m = conv.messages[index];
  const el = document.createElement('article');
  el.className = `message ${m.role}${m.error ? ' error' : ''}`;
  el.dataset.index = String(index);
  const who = document.createElement('div');
  who.className = 'who';
  who.textContent = m.role === 'user' ? 'You' : 'Assistant';
  el.append(who);
  if (m.role === 'assistant') {
    const fold = document.createElement('details');
    fold.className = 'reasoning';
    fold.hidden = !m.reasoning;
    const summary = document.createElement('summary');
    summary.textContent = 'Reasoning';
    const rt = document.createElement('div');
    rt.className = 'reasoning-text';
    rt.textContent = m.reasoning || '';
    fold.append(summary, rt);
    el.append(fold);
  }
  const body = document.createElement('div');
  body.className = m.role === 'user' ? 'body plain' : 'body';
  if (m.role === 'user') body.textContent = m.content;
  else renderMarkdown(body, m.content);
  el.append(body);
  const tools = document.createElement('div');
  tools.className = 'tools';
  renderToolCalls(tools, m.tool_calls);
  el.append(tools);
  if (m.error) {
    const err = document.createElement('div');
    err.className = 'error-text';
    err.textContent = m.error;
    el.append(err);
  }
  const meta = document.createElement('div');
  meta.className = 'meta';
  meta.textContent = formatMeta(m.stats);
  el.append(meta);
  const actions = document.createElement('div');
  actions.className = 'actions';
  actions.append(button('Copy', () => copyText(m.content), `Copy ${m.role === 'user' ? 'your' : 'the assistant'} message`));
  if (m.role === 'user') actions.append(button('Edit', () => editMessage(conv, index, el), 'Edit and resend this message'));
  if (m.role === 'assistant' && index === conv.messages.length - 1)
    actions.append(button('Regenerate', () => regenerate(conv), 'Regenerate the last answer'));
  el.append(actions);
  return el;
}

function renderConversation() {
  const conv = currentConversation();
  els.messages.replaceChildren(...conv.messages.map((_, i) => messageElement(conv, i)));
  els.messages.scrollTop = els.messages.scrollHeight;
  renderConversationList();
}

function renderConversationList() {
  const items = state.conversations.map((c) => {
    const li = document.createElement('li');
    if (c.id === state.current) li.setAttribute('aria-current', 'true');
    const open = button(c.title || 'Untitled', () => {
      if (state.abort) return;
      state.current = c.id;
      persist();
      renderConversation();
    });
    open.className = 'open-chat';
    open.title = c.title || 'Untitled';
    const rename = button('Rename', () => {
      const t = window.prompt('Rename the conversation', c.title || '');
      if (t != null && t.trim()) {
        c.title = t.trim().slice(0, 120);
        persist();
        renderConversationList();
      }
    }, `Rename ${c.title || 'Untitled'}`);
    rename.classList.add('small');
    const del = button('Delete', () => {
      if (state.abort && c.id === state.current) return;
      state.conversations = state.conversations.filter((x) => x.id !== c.id);
      if (state.current === c.id) state.current = state.conversations[0]?.id || null;
      persist();
      renderConversation();
    }, `Delete ${c.title || 'Untitled'}`);
    del.classList.add('small');
    li.append(open, rename, del);
    return li;
  });
  els.conversations.replaceChildren(...items);
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text || '');
  } catch {
    // Clipboard access refused (an insecure origin, a denied permission): select instead.
    const t = document.createElement('textarea');
    t.value = text || '';
    document.body.append(t);
    t.select();
    try { document.execCommand('copy'); } catch { /* nothing more to try */ }
    t.remove();
  }
}

function editMessage(conv, index, el) {
  if (state.abort) return;
  const body = el.querySelector('.body');
  const box = document.createElement('div');
  box.className = 'edit-box';
  const label = document.createElement('label');
  label.className = 'visually-hidden';
  label.textContent = 'Edit your message';
  const area = document.createElement('textarea');
  area.value = conv.messages[index].content;
  area.rows = 3;
  const id = `edit-${index}`;
  area.id = id;
  label.htmlFor = id;
  const row = document.createElement('div');
  row.className = 'row';
  row.append(
    button('Resend', () => {
      const text = area.value.trim();
      if (!text) return;
      conv.messages = conv.messages.slice(0, index);
      persist();
      renderConversation();
      sendMessage(text);
    }),
    button('Cancel', () => renderConversation()),
  );
  box.append(label, area, row);
  body.replaceWith(box);
  area.focus();
}

function regenerate(conv) {
  if (state.abort) return;
  if (conv.messages.at(-1)?.role === 'assistant') conv.messages.pop();
  persist();
  renderConversation();
  runAnswer(conv);
}

// ---- the API ----

function authHeaders() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

// Asks for a key (once for every waiter) and resolves when one is given.
function askKey() {
  return new Promise((resolve) => {
    state.keyWaiters.push(resolve);
    if (!els.keyDialog.open) {
      els.apiKey.value = '';
      els.keyDialog.showModal();
      els.apiKey.focus();
    }
  });
}

els.keyForm.addEventListener('submit', () => {
  const key = els.apiKey.value.trim();
  if (!key) return;
  state.key = key;
  sessionStorage.setItem(API_KEY, key);
  if (els.rememberKey.checked) localStorage.setItem(API_KEY, key);
  else localStorage.removeItem(API_KEY);
  const waiters = state.keyWaiters;
  state.keyWaiters = [];
  for (const w of waiters) w();
});

// fetch with the key; a 401 asks for one and tries again.
async function api(path, init = {}) {
  for (;;) {
    const r = await fetch(path, { ...init, headers: { ...(init.headers || {}), ...authHeaders() } });
    if (r.status !== 401) return r;
    await r.body?.cancel();
    sessionStorage.removeItem(API_KEY);
    localStorage.removeItem(API_KEY);
    state.key = '';
    await askKey();
  }
}

async function loadModel() {
  try {
    const r = await api('/v1/models');
    if (!r.ok) return;
    const body = await r.json();
    state.model = body.data?.[0] || null;
    if (state.model) {
      els.model.textContent = state.model.id;
      document.title = `${state.model.id} · inferd`;
    }
  } catch {
    els.model.textContent = 'server unreachable';
  }
}

// Reads a text/event-stream body, calling onData with each event's data.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data) onData(data);
    }
  }
}

function requestBody(conv) {
  const messages = [];
  const system = els.system.value.trim();
  if (system) messages.push({ role: 'system', content: system });
  for (const m of conv.messages) {
    if (m.error && !m.content) continue;
    const out = { role: m.role, content: m.content || '' };
    if (m.tool_calls?.length) out.tool_calls = m.tool_calls;
    messages.push(out);
  }
  const body = {
    model: state.model?.id,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number(els.temperature.value),
    max_tokens: Math.max(1, Number(els.maxTokens.value) || 512),
    chat_template_kwargs: { enable_thinking: els.thinking.checked },
  };
  return body;
}

function setBusy(busy) {
  els.stop.hidden = !busy;
  els.send.disabled = busy;
  if (!busy) state.abort = null;
}

// Streams the assistant's answer to conv's last user turn into a new message.
async function runAnswer(conv) {
  const payload = JSON.stringify(requestBody(conv)); // before the answer's own placeholder
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [], stats: null };
  conv.messages.push(msg);
  const index = conv.messages.length - 1;
  let el = messageElement(conv, index);
  els.messages.append(el);
  const body = el.querySelector('.body');
  const fold = el.querySelector('.reasoning');
  const reasoningText = el.querySelector('.reasoning-text');
  el.dataset.streaming = 'true';
  const controller = new AbortController();
  state.abort = controller;
  setBusy(true);
  const started = performance.now();
  let first = null;
  let usage = null;
  let finish = null;
  let pending = false;
  const paint = () => {
    pending = false;
    renderMarkdown(body, msg.content);
    if (msg.reasoning) {
      fold.hidden = false;
      reasoningText.textContent = msg.reasoning;
    }
    els.messages.scrollTop = els.messages.scrollHeight;
  };
  try {
    const r = await api('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: payload,
      signal: controller.signal,
    });
    if (!r.ok) {
      let text = `HTTP ${r.status}`;
      try { text = (await r.json()).error?.message || text; } catch { /* not JSON */ }
      throw new Error(text);
    }
    await readEvents(r, (data) => {
      if (data === '[DONE]') return;
      let chunk;
      try { chunk = JSON.parse(data); } catch { return; }
      if (chunk.error) throw new Error(chunk.error.message || 'the server reported an error');
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) return;
      const d = choice.delta || {};
      const reasoning = d.reasoning_content ?? d.reasoning;
      if (reasoning || d.content) first ??= performance.now();
      if (reasoning) msg.reasoning += reasoning;
      if (d.content) msg.content += d.content;
      for (const t of d.tool_calls || []) {
        const slot = (msg.tool_calls[t.index] ??= { id: t.id, type: 'function', function: { name: '', arguments: '' } });
        if (t.id) slot.id = t.id;
        if (t.function?.name) slot.function.name += t.function.name;
        if (t.function?.arguments) slot.function.arguments += t.function.arguments;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      if (!pending) {
        pending = true;
        requestAnimationFrame(paint);
      }
    });
  } catch (e) {
    if (controller.signal.aborted) finish = 'stopped';
    else msg.error = String(e.message || e);
  }
  const ended = performance.now();
  const generated = usage?.completion_tokens;
  msg.stats = {
    completion_tokens: generated ?? null,
    ttft_ms: first != null ? first - started : null,
    tokens_per_s: first != null && generated > 1 && ended > first ? (generated - 1) / ((ended - first) / 1000) : null,
    cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
    finish_reason: finish,
  };
  if (!msg.tool_calls.length) delete msg.tool_calls;
  if (conv.title === 'New chat') {
    const firstUser = conv.messages.find((m) => m.role === 'user');
    if (firstUser) conv.title = firstUser.content.slice(0, 60);
  }
  persist();
  setBusy(false);
  const fresh = messageElement(conv, index);
  fresh.dataset.done = 'true';
  fresh.dataset.finish = finish || (msg.error ? 'error' : '');
  el.replaceWith(fresh);
  el = fresh;
  renderConversationList();
  els.messages.scrollTop = els.messages.scrollHeight;
  // The previous answer's Regenerate button belongs to the newest answer only.
  for (const old of els.messages.querySelectorAll('article.assistant')) {
    if (old !== el && old.dataset.index !== String(index)) {
      for (const b of old.querySelectorAll('.actions button')) if (b.textContent === 'Regenerate') b.remove();
    }
  }
}

function sendMessage(text) {
  const conv = currentConversation();
  conv.messages.push({ role: 'user', content: text });
  persist();
  els.messages.append(messageElement(conv, conv.messages.length - 1));
  return runAnswer(conv);
}

// ---- the server panel ----

function fmtBytes(n) {
  if (n == null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function refreshStats() {
  let s;
  try {
    const r = await api('/stats');
    if (!r.ok) return;
    s = await r.json();
  } catch {
    return;
  }
  const pc = s.prompt_cache || {};
  const e = s.engine || {};
  const lookups = (pc.hits || 0) + (pc.misses || 0);
  const rows = [
    ['Cache hit rate', lookups ? `${((100 * pc.hits) / lookups).toFixed(1)} %` : '–'],
    ['Cache hits / misses', `${pc.hits ?? '–'} / ${pc.misses ?? '–'}`],
    ['Cached bytes', fmtBytes(pc.bytes)],
    ['KV blocks in use', e.kv_blocks_total != null ? `${e.kv_blocks_total - e.kv_blocks_free} / ${e.kv_blocks_total}` : '–'],
    ['Queue depth', e.queue_depth ?? '–'],
    ['Running', e.running ?? '–'],
    ['Requests cancelled', e.requests_cancelled ?? '–'],
    ['Tokens generated', e.generated_tokens ?? '–'],
  ];
  els.statsList.replaceChildren(
    ...rows.flatMap(([k, v]) => {
      const dt = document.createElement('dt');
      dt.textContent = k;
      const dd = document.createElement('dd');
      dd.textContent = String(v);
      return [dt, dd];
    }),
  );
}

function togglePanel(panel, toggle, other, otherToggle) {
  const open = panel.hidden;
  panel.hidden = !open;
  toggle.setAttribute('aria-expanded', String(open));
  if (open && other && !other.hidden) {
    other.hidden = true;
    otherToggle.setAttribute('aria-expanded', 'false');
  }
  syncStatsTimer();
}

function syncStatsTimer() {
  const want = !els.stats.hidden;
  if (want && !state.statsTimer) {
    refreshStats();
    state.statsTimer = setInterval(refreshStats, STATS_EVERY_MS);
  } else if (!want && state.statsTimer) {
    clearInterval(state.statsTimer);
    state.statsTimer = null;
  }
}

// ---- wiring ----

els.prompt.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    els.composer.requestSubmit();
  }
});

els.composer.addEventListener('submit', (e) => {
  e.preventDefault();
  const text = els.prompt.value.trim();
  if (!text || state.abort) return;
  els.prompt.value = '';
  sendMessage(text);
});

els.stop.addEventListener('click', () => state.abort?.abort());

els.newChat.addEventListener('click', () => {
  if (state.abort) return;
  state.current = null;
  currentConversation();
  renderConversation();
  els.prompt.focus();
});

els.exportChat.addEventListener('click', () => {
  const blob = new Blob([JSON.stringify(state.conversations, null, 2)], { type: 'application/json' });
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = 'inferd-conversations.json';
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
});

els.toggleSidebar.addEventListener('click', () => {
  const open = !els.sidebar.classList.contains('open');
  els.sidebar.classList.toggle('open', open);
  els.toggleSidebar.setAttribute('aria-expanded', String(open));
});
els.toggleSettings.addEventListener('click', () => togglePanel(els.settings, els.toggleSettings, els.stats, els.toggleStats));
els.toggleStats.addEventListener('click', () => togglePanel(els.stats, els.toggleStats, els.settings, els.toggleSettings));
for (const input of [els.system, els.temperature, els.maxTokens, els.thinking]) {
  input.addEventListener('input', saveSettings);
  input.addEventListener('change', saveSettings);
}
// Another tab's changes to the stored conversations show here too.
window.addEventListener('storage', (e) => {
  if (e.key === STORE_KEY && !state.abort) {
    state.conversations = load(STORE_KEY, []);
    renderConversation();
  }
});

loadSettings();
renderConversation();
loadModel();
els.prompt.focus();
