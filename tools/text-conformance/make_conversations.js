#!/usr/bin/env node
// tools/text-conformance/make_conversations.js — writes tests/text/conversations.jsonl, chat-template conformance inputs.
//
// Usage: node tools/text-conformance/make_conversations.js [OUT]   (default OUT: tests/text/conversations.jsonl)
// Deterministic (seeded mulberry32). One JSON object per line:
//   {"id":N, "template":"qwen3"|"llama3"|"gemma3"|"phi3.5-mini"|"phi4-mini", "messages":[...], "tools":[...]?,
//    "add_generation_prompt":bool, "enable_thinking":bool?, "expect_error":true?}
// "tools" and "enable_thinking" go into the render context only when present. "expect_error"
// marks conversations that must make the template call raise_exception (Gemma 3's role
// alternation and content checks).
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const OUT = process.argv[2] || path.join(__dirname, "..", "..", "tests", "text", "conversations.jsonl");

function mulberry32(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rnd = mulberry32(7);
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const chance = (p) => rnd() < p;

// Message texts, including the awkward ones: quotes, backslashes, Jinja-looking text (it is data,
// never evaluated), unicode, whitespace that `trim` removes, empty strings, special-token text.
const TEXTS = [
  "Hello, how are you?", "Hi", "What is 2+2?", "Tell me a joke.", "Thanks!", "ok", "",
  " ", "  padded both sides  ", "\n\nleading newlines", "trailing newlines\n\n", "\ttabbed\t",
  "She said \"hi\" and 'bye'.", "back\\slash \\n not a newline", "{{ not_a_variable }}", "{% if x %}y{% endif %}",
  "{# comment? #}", "Ünïcödé ☃ 你好 مرحبا שלום 🙂👍🏽 👨‍👩‍👧", "line1\nline2\r\nline3", "e\u0301 vs é",
  "<|im_start|>user\nfake<|im_end|>", "<start_of_turn>model\nfake<end_of_turn>", "<|eot_id|>", "<think>", "</think>",
  "A longer message. ".repeat(20).trim(), "Code:\n```python\ndef f(x):\n    return x\n```", "JSON: {\"a\": [1, 2]}",
  "\u00a0nbsp\u00a0", "\u3000ideographic\u3000", "zero\u200bwidth", "null", "None", "true", "0", "[]",
];
const SYSTEMS = ["You are helpful.", "You are a helpful assistant.", "", "  Be terse.  ", "Réponds en français. 🇫🇷",
  "System with \"quotes\" and {{ braces }}", "Multi\nline\nsystem\n"];
const REASONING = ["Let me think.", "\nstep 1\nstep 2\n", "", "The user wants a joke. 🤔", "a</b>c"];

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the weather for a city.",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"] } } },
  { type: "function", function: { name: "search", description: "Search the web for \"anything\" — even ünïcode.",
    parameters: { type: "object", properties: { query: { type: "string" }, max_results: { type: "integer", minimum: 1, maximum: 10 } },
      required: ["query"] } } },
  { type: "function", function: { name: "calc", description: "", parameters: { type: "object", properties: {
    expr: { type: "string" }, precision: { type: "number", default: 0.5 }, flags: { type: "array", items: { type: "boolean" } } } } } },
  { type: "function", function: { name: "no_params", description: "Takes nothing.", parameters: { type: "object", properties: {} } } },
];
const ARGS = {
  get_weather: [{ city: "Paris" }, { city: "東京", unit: "celsius" }, { city: "New \"York\"", unit: "fahrenheit" }],
  search: [{ query: "inferd" }, { query: "a\\b\nc", max_results: 3 }, { query: "" }],
  calc: [{ expr: "1+1" }, { expr: "2*3", precision: 0.25, flags: [true, false] }, { expr: "x", nested: { a: null, b: [1, { c: "d" }] } }],
  no_params: [{}],
};
const RESULTS = ["{\"temperature\": 21, \"sky\": \"clear\"}", "22°C, sunny ☀️", "", "error: not found", "line1\nline2", "42",
  "<tool_response>nested</tool_response>"];

const convs = [];
const add = (c) => convs.push(c);

function userAssistantTurns(n, contentFn) {
  const m = [];
  for (let i = 0; i < n; i++) {
    m.push({ role: "user", content: contentFn() });
    if (i < n - 1 || chance(0.4)) m.push({ role: "assistant", content: contentFn() });
  }
  return m;
}

// ---- Qwen3 -------------------------------------------------------------------
function qwenToolCall(useWrapper, stringArgs) {
  const t = pick(TOOLS).function.name;
  const args = pick(ARGS[t]);
  const a = stringArgs ? JSON.stringify(args) : args;
  return useWrapper ? { type: "function", function: { name: t, arguments: a } } : { name: t, arguments: a };
}
function qwenAssistant() {
  const r = ri(5);
  if (r === 0) return { role: "assistant", content: "<think>\n" + pick(REASONING) + "\n</think>\n\n" + pick(TEXTS) };
  if (r === 1) return { role: "assistant", content: pick(TEXTS), reasoning_content: pick(REASONING) };
  if (r === 2) return { role: "assistant", content: pick(TEXTS), reasoning_content: null };
  if (r === 3) return { role: "assistant", content: pick(REASONING) + "</think>" + pick(TEXTS) };
  return { role: "assistant", content: pick(TEXTS) };
}
function qwen3Conv(i) {
  const c = { template: "qwen3", messages: [] };
  const withTools = i % 3 === 0;
  if (chance(0.6)) c.messages.push({ role: "system", content: pick(SYSTEMS) });
  if (withTools) {
    c.tools = [];
    const k = 1 + ri(TOOLS.length);
    for (let j = 0; j < k; j++) c.tools.push(TOOLS[(i + j) % TOOLS.length]);
  }
  const turns = 1 + ri(4);
  for (let t = 0; t < turns; t++) {
    c.messages.push({ role: "user", content: pick(TEXTS) });
    const last = t === turns - 1;
    if (last && chance(0.5)) break;
    if (withTools && chance(0.7)) {
      const calls = [];
      const n = 1 + ri(3);
      for (let j = 0; j < n; j++) calls.push(qwenToolCall(chance(0.7), chance(0.3)));
      c.messages.push({ role: "assistant", content: pick(["", "", "Let me check.", "<think>\nneed a tool\n</think>\n\n"]), tool_calls: calls });
      for (let j = 0; j < n; j++) c.messages.push({ role: "tool", content: pick(RESULTS) });
      if (!last || chance(0.5)) c.messages.push(qwenAssistant());
    } else {
      c.messages.push(qwenAssistant());
    }
    if (chance(0.1)) c.messages.push({ role: "system", content: pick(SYSTEMS) }); // a system turn that is not first
  }
  c.add_generation_prompt = chance(0.6);
  const th = ri(3);
  if (th === 1) c.enable_thinking = true;
  if (th === 2) c.enable_thinking = false;
  return c;
}
for (let i = 0; i < 130; i++) add(qwen3Conv(i));
// Fixed Qwen3 cases: a user turn that is itself a tool response, and the spec's golden chat.
add({ template: "qwen3", messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hello, how are you?" }], add_generation_prompt: true });
add({ template: "qwen3", messages: [{ role: "user", content: "Hi" }], add_generation_prompt: true, enable_thinking: false });
add({ template: "qwen3", messages: [{ role: "user", content: "q" }, { role: "assistant", content: "", tool_calls: [qwenToolCall(true, false)] },
  { role: "user", content: "<tool_response>\n42\n</tool_response>" }, { role: "assistant", content: "<think>\nok\n</think>\n\nIt is 42." }],
  add_generation_prompt: false });
add({ template: "qwen3", messages: [{ role: "user", content: "" }], add_generation_prompt: false });
add({ template: "qwen3", tools: [TOOLS[0]], messages: [{ role: "user", content: "weather?" }], add_generation_prompt: true, enable_thinking: true });

// ---- Llama 3 -----------------------------------------------------------------
for (let i = 0; i < 110; i++) {
  const c = { template: "llama3", messages: [] };
  if (chance(0.5)) c.messages.push({ role: "system", content: pick(SYSTEMS) });
  c.messages.push(...userAssistantTurns(1 + ri(4), () => pick(TEXTS)));
  if (chance(0.1)) c.messages.push({ role: pick(["ipython", "tool"]), content: pick(RESULTS) });
  c.add_generation_prompt = chance(0.5);
  add(c);
}
add({ template: "llama3", messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hello, how are you?" }], add_generation_prompt: true });

// ---- Gemma 3 -----------------------------------------------------------------
function gemmaContent() {
  if (chance(0.7)) return pick(TEXTS);
  const parts = [];
  const n = 1 + ri(4);
  for (let j = 0; j < n; j++) parts.push(chance(0.4) ? { type: "image" } : { type: "text", text: pick(TEXTS) });
  if (chance(0.1)) parts.push({ type: "audio", audio: "ignored" }); // neither image nor text: rendered as nothing
  return parts;
}
for (let i = 0; i < 110; i++) {
  const c = { template: "gemma3", messages: [] };
  const sys = ri(3);
  if (sys === 1) c.messages.push({ role: "system", content: pick(SYSTEMS) });
  if (sys === 2) c.messages.push({ role: "system", content: [{ type: "text", text: pick(SYSTEMS) }] });
  c.messages.push(...userAssistantTurns(1 + ri(4), gemmaContent));
  c.add_generation_prompt = chance(0.6);
  add(c);
}
add({ template: "gemma3", messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hello, how are you?" }], add_generation_prompt: true });
// Odd roles in the assistant slot pass the alternation check (only "user" is tested) and render as-is.
add({ template: "gemma3", messages: [{ role: "user", content: "a" }, { role: "system", content: "late system" }], add_generation_prompt: true });
add({ template: "gemma3", messages: [{ role: "user", content: "a" }, { role: "tool", content: "r" }], add_generation_prompt: false });
// Conversations the Gemma 3 template rejects with raise_exception.
const BAD_GEMMA = [
  [{ role: "assistant", content: "I speak first" }],
  [{ role: "user", content: "a" }, { role: "user", content: "b" }],
  [{ role: "system", content: "s" }, { role: "assistant", content: "x" }],
  [{ role: "user", content: "a" }, { role: "assistant", content: "b" }, { role: "assistant", content: "c" }],
  [{ role: "user", content: 42 }],
  [{ role: "user", content: null }],
  [{ role: "user", content: "a" }, { role: "assistant", content: true }],
];
for (const m of BAD_GEMMA) add({ template: "gemma3", messages: m, add_generation_prompt: true, expect_error: true });

// ---- Phi-3.5-mini and Phi-4-mini ----------------------------------------------
// Added after the others so that their ids and draws stay as they were. Contents are strings
// (both templates concatenate them with +); Phi's own markers appear as text too.
const PHI_TEXTS = TEXTS.concat(["<|end|>", "<|user|>\nfake<|end|>\n<|assistant|>\n", "<|endoftext|>", "<|tool|>[]<|/tool|>"]);
function phiTurns(n) {
  const m = [];
  for (let i = 0; i < n; i++) {
    m.push({ role: "user", content: pick(PHI_TEXTS) });
    if (i < n - 1 || chance(0.4)) m.push({ role: "assistant", content: pick(PHI_TEXTS) });
  }
  return m;
}
// Phi-3.5-mini: an empty system message is left out; roles other than system, user and
// assistant render as nothing.
for (let i = 0; i < 44; i++) {
  const c = { template: "phi3.5-mini", messages: [] };
  if (chance(0.6)) c.messages.push({ role: "system", content: chance(0.25) ? "" : pick(SYSTEMS) });
  c.messages.push(...phiTurns(1 + ri(4)));
  if (chance(0.15)) c.messages.push({ role: pick(["tool", "function", "ipython"]), content: pick(RESULTS) });
  if (chance(0.1)) c.messages.push({ role: "system", content: pick(SYSTEMS) }); // a system turn that is not first
  c.add_generation_prompt = chance(0.6);
  add(c);
}
add({ template: "phi3.5-mini", messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hello, how are you?" }], add_generation_prompt: true });
add({ template: "phi3.5-mini", messages: [], add_generation_prompt: false });
// Phi-4-mini: a system message may carry its tools as a JSON string ("tools"; null means none),
// and every role renders as <|role|>.
const phiTools = (k) => JSON.stringify(TOOLS.slice(0, k).map((t) => t.function));
for (let i = 0; i < 44; i++) {
  const c = { template: "phi4-mini", messages: [] };
  const sys = ri(4);
  if (sys === 1) c.messages.push({ role: "system", content: pick(SYSTEMS) });
  if (sys === 2) c.messages.push({ role: "system", content: pick(SYSTEMS), tools: phiTools(1 + ri(TOOLS.length)) });
  if (sys === 3) c.messages.push({ role: "system", content: pick(SYSTEMS), tools: null });
  c.messages.push(...phiTurns(1 + ri(4)));
  if (chance(0.2)) c.messages.push({ role: "tool", content: pick(RESULTS) });
  if (chance(0.1)) c.messages.push({ role: "user", content: pick(PHI_TEXTS), tools: "[]" }); // only a system message's tools count
  c.add_generation_prompt = chance(0.6);
  add(c);
}
add({ template: "phi4-mini", messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Hello, how are you?" }], add_generation_prompt: true });
add({ template: "phi4-mini", messages: [{ role: "system", content: "", tools: "" }, { role: "user", content: "" }], add_generation_prompt: false });

const lines = convs.map((c, id) => JSON.stringify({ id, ...c }));
fs.mkdirSync(path.dirname(OUT), { recursive: true });
fs.writeFileSync(OUT, lines.join("\n") + "\n");
const count = {};
for (const c of convs) count[c.template] = (count[c.template] || 0) + 1;
console.error(`make_conversations: ${convs.length} conversations ${JSON.stringify(count)} -> ${OUT}`);
