#!/usr/bin/env node
// bench/tokenizer_speed.js — assembles ~10 MB of mixed text from tests/text/corpus.jsonl and times the HF Rust reference encoder on it.
//
// Usage: node bench/tokenizer_speed.js DATA NAME DOCS_FILE [MB]
// Writes DOCS_FILE (documents of ~4 KB separated by NUL bytes; bench/tokenizer_bench.c reads the
// same file), then encodes all documents with npm tokenizers@0.23.2 in one encodeBatch call with
// TOKENIZERS_PARALLELISM=false, so Rust runs on one thread as the C side does and pays the N-API
// crossing once (add_special_tokens=false), and prints one line:
//   rust NAME bytes=B docs=D tokens=T seconds=S mb_per_s=R
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.join(__dirname, "..");
process.env.TOKENIZERS_PARALLELISM = "false"; // read by the Rust side when it first encodes
const { Tokenizer } = require(path.join(ROOT, "tests", "node", "node_modules", "tokenizers"));

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

async function main() {
  const [data, name, docsFile, mbArg] = process.argv.slice(2);
  if (!docsFile) {
    console.error("usage: tokenizer_speed.js DATA NAME DOCS_FILE [MB]");
    process.exit(2);
  }
  const target = Math.round(parseFloat(mbArg || "10") * 1e6);
  // Valid-UTF-8 corpus strings without NUL (the separator), shorter than a document.
  const texts = fs.readFileSync(path.join(ROOT, "tests", "text", "corpus.jsonl"), "utf8")
    .split("\n").filter((l) => l.length).map((l) => JSON.parse(l))
    .filter((e) => e.text !== undefined && e.text.length > 0 && !e.text.includes("\u0000") && e.text.length < 4000)
    .map((e) => e.text);
  const rnd = mulberry32(1);
  const docs = [];
  let total = 0;
  while (total < target) {
    let d = "";
    while (Buffer.byteLength(d) < 4096) d += texts[Math.floor(rnd() * texts.length)] + (rnd() < 0.5 ? " " : "\n");
    docs.push(d);
    total += Buffer.byteLength(d);
  }
  fs.writeFileSync(docsFile, docs.join("\u0000"));

  const tok = Tokenizer.fromFile(path.join(data, name, "tokenizer.json"));
  await tok.encode(docs[0], null, { addSpecialTokens: false }); // warm-up
  const t0 = process.hrtime.bigint();
  const encodings = await tok.encodeBatch(docs, { addSpecialTokens: false });
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  let tokens = 0;
  for (const e of encodings) tokens += e.getIds().length;
  console.log(`rust ${name} bytes=${total} docs=${docs.length} tokens=${tokens} seconds=${s.toFixed(3)} mb_per_s=${(total / 1e6 / s).toFixed(2)}`);
}
main().catch((e) => { console.error(e); process.exit(1); });
