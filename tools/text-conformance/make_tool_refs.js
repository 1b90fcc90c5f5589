#!/usr/bin/env node
// tools/text-conformance/make_tool_refs.js — renders chat requests with tool calls and tool results through the Qwen3 template with @huggingface/jinja into tests/text/tool-refs-qwen3.jsonl.
//
// Usage: node tools/text-conformance/make_tool_refs.js DATA
//   DATA: the directory filled by scripts/fetch-tokenizers.sh (DATA/qwen3/tokenizer_config.json)
// Needs `npm ci --prefix tests/node` (@huggingface/jinja@0.5.11).
// Each request is an OpenAI chat body as a client sends it: assistant tool calls carry their
// arguments as JSON strings. The reference renders what the template is meant to see: content
// null as "", each arguments string that holds a JSON object parsed into that object (others stay
// strings), tools, add_generation_prompt true, enable_thinking from chat_template_kwargs.
// tests/unit/test_template_conformance.c sends each request through prompt_build and expects the
// output byte for byte. Output lines: {"id":N,"request":{...},"output":"..."}.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.join(__dirname, "..", "..");

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather for a city.",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] } } },
  { type: "function", function: { name: "get_time", description: "Local time — in a zone.",
    parameters: { type: "object", properties: { tz: { type: "string" } } } } },
];

const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: args } });

const requests = [
  { messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Weather in Paris for two days?" },
      { role: "assistant", content: null, tool_calls: [call("call_1", "get_weather", "{\"city\": \"Paris\", \"days\": 2}")] },
      { role: "tool", tool_call_id: "call_1", content: "{\"temp_c\": 12, \"sky\": \"overcast\"}" },
      { role: "user", content: "And tomorrow?" },
    ], tools },
  { messages: [
      { role: "user", content: "Weather and time in Zürich?" },
      { role: "assistant", content: "Checking both.", tool_calls: [
          call("call_a", "get_weather", "{\"city\":\"Zürich\",\"note\":{\"nested\":[1,2.5,true,null]}}"),
          call("call_b", "get_time", "{\"tz\": \"Europe/Zurich\"}")] },
      { role: "tool", tool_call_id: "call_a", content: "9°C" },
      { role: "tool", tool_call_id: "call_b", content: "14:05" },
    ], tools, chat_template_kwargs: { enable_thinking: false } },
  { messages: [
      { role: "user", content: "Time?" },
      { role: "assistant", content: "", tool_calls: [call("c1", "get_time", "not json at all"), call("c2", "get_time", "[1, 2]")] },
      { role: "tool", tool_call_id: "c1", content: "error: bad arguments" },
      { role: "tool", tool_call_id: "c2", content: "error: bad arguments" },
      { role: "assistant", content: "Sorry, that failed." },
      { role: "user", content: "Try again." },
    ], tools, chat_template_kwargs: { enable_thinking: true } },
];

function tokenText(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "object") return v.content === undefined ? null : v.content;
  return v;
}

function asTemplateSees(messages) {
  return messages.map((m) => {
    const c = { ...m };
    if (c.content === null) c.content = "";
    if (c.tool_calls) {
      c.tool_calls = c.tool_calls.map((tc) => {
        let args = tc.function.arguments;
        try {
          const v = JSON.parse(args);
          if (v !== null && typeof v === "object" && !Array.isArray(v)) args = v;
        } catch (e) { /* stays a string */ }
        return { ...tc, function: { ...tc.function, arguments: args } };
      });
    }
    return c;
  });
}

async function main() {
  const data = process.argv[2];
  if (!data) {
    console.error("usage: make_tool_refs.js DATA");
    process.exit(2);
  }
  const { Template } = await import(path.join(ROOT, "tests", "node", "node_modules", "@huggingface", "jinja", "dist", "index.js"));
  const cfg = JSON.parse(fs.readFileSync(path.join(data, "qwen3", "tokenizer_config.json"), "utf8"));
  const tmpl = new Template(cfg.chat_template);
  const out = requests.map((request, id) => {
    const ctx = { messages: asTemplateSees(request.messages), tools: request.tools, add_generation_prompt: true,
      bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) };
    const kw = request.chat_template_kwargs || {};
    if (kw.enable_thinking !== undefined) ctx.enable_thinking = kw.enable_thinking;
    return JSON.stringify({ id, request, output: tmpl.render(ctx) });
  });
  const file = path.join(ROOT, "tests", "text", "tool-refs-qwen3.jsonl");
  fs.writeFileSync(file, out.join("\n") + "\n");
  console.log(`${path.relative(ROOT, file)}: ${out.length} requests`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
