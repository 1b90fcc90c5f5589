#!/usr/bin/env node
// tools/text-conformance/make_refs.js — encodes/decodes the corpus with the HF Rust reference and writes tests/text/refs-NAME.txt.
//
// Usage: node tools/text-conformance/make_refs.js DATA [NAME...]
//   DATA: the directory filled by scripts/fetch-tokenizers.sh (DATA/NAME/tokenizer.json)
//   NAME: qwen3 llama3 gemma3 by default
// Needs `npm ci --prefix tests/node` (npm tokenizers@0.23.2, the official Rust tokenizers as N-API bindings).
// Output, one line per corpus id, tab-separated:
//   id  ids-with-special  ids-without-special  hex(decode(ids-without-special, skip_special=false))
// ids are comma-separated decimals (an empty field for no ids). Entries stored as "hex" in the
// corpus are invalid UTF-8: they are turned into a string with TextDecoder's default (lossy,
// one U+FFFD per maximal subpart), which is what the reference can be given.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.join(__dirname, "..", "..");
const { Tokenizer } = require(path.join(ROOT, "tests", "node", "node_modules", "tokenizers"));

async function main() {
  const data = process.argv[2];
  if (!data) {
    console.error("usage: make_refs.js DATA [NAME...]");
    process.exit(2);
  }
  const names = process.argv.length > 3 ? process.argv.slice(3) : ["qwen3", "llama3", "gemma3"];
  const corpus = fs.readFileSync(path.join(ROOT, "tests", "text", "corpus.jsonl"), "utf8")
    .split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
  const lossy = new TextDecoder("utf-8");
  for (const name of names) {
    const tok = Tokenizer.fromFile(path.join(data, name, "tokenizer.json"));
    const out = [];
    for (const e of corpus) {
      const text = e.text !== undefined ? e.text : lossy.decode(Buffer.from(e.hex, "hex"));
      const withSp = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
      const noSp = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      const dec = await tok.decode(noSp, false);
      out.push(`${e.id}\t${withSp.join(",")}\t${noSp.join(",")}\t${Buffer.from(dec, "utf8").toString("hex")}`);
    }
    const file = path.join(ROOT, "tests", "text", `refs-${name}.txt`);
    fs.writeFileSync(file, out.join("\n") + "\n");
    console.error(`make_refs: ${name}: ${out.length} lines, ${fs.statSync(file).size} bytes -> ${file}`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
