#!/usr/bin/env node
// tools/text-conformance/make_corpus.js — writes tests/text/corpus.jsonl, the deterministic tokenizer conformance corpus.
//
// Usage: node tools/text-conformance/make_corpus.js [OUT]   (default OUT: tests/text/corpus.jsonl)
// Every string comes from a fixed list or from a seeded PRNG (mulberry32), so the output is
// byte-identical on every run. Lines are {"id":N,"text":S} or, for byte strings that are not
// valid UTF-8, {"id":N,"hex":H}.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const OUT = process.argv[2] || path.join(__dirname, "..", "..", "tests", "text", "corpus.jsonl");

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
const rnd = mulberry32(20261129);
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const rep = (s, n) => s.repeat(n);

// ---- fragment pools -------------------------------------------------------
const WORDS = ["Hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
  "tokenizer", "inference", "server", "don't", "I'm", "we've", "they're", "you'll", "she'd", "it's",
  "DON'T", "I'M", "We'Ve", "naïve", "café", "résumé", "coöperate", "Straße", "ﬁnance", "ﬀ",
  "unbelievable", "antidisestablishmentarianism", "GPU", "KV-cache", "e.g.", "i.e.", "U.S.A.", "CamelCaseWord",
  "snake_case_name", "kebab-case-name", "ALLCAPS", "x", "a", "I", "OK", "Ü", "Ñandú", "İstanbul", "ß", "Ǆ"];
const CJK = ["你好", "世界", "我爱自然语言处理", "今天天气很好。", "日本語のテキスト", "こんにちは", "カタカナ", "ひらがな",
  "한국어", "안녕하세요", "漢字", "中文，标点！", "「引用」", "『二重』", "〜", "・", "１２３", "ＡＢＣ", "ｶﾀｶﾅ", "繁體中文測試",
  "𠀀𠀁𠀂", "𪚥", "龘", "々", "〇"];
const EMOJI = ["🙂", "😀", "👍", "👍🏻", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "🏳️‍🌈", "🏴‍☠️", "❤️", "❤", "☺️",
  "🇺🇸", "🇯🇵", "🇩🇪", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "1️⃣", "#️⃣", "🤷‍♀️", "🙋🏼‍♂️", "👁️‍🗨️", "🫠", "🪿", "🥲", "©", "®", "™", "✔️", "🔥🔥🔥"];
// NFC and NFD forms; Qwen3 normalizes to NFC, the others do not.
const COMBINING = ["é", "e\u0301", "ñ", "n\u0303", "Å", "A\u030a", "\u212b", "ệ", "e\u0323\u0302", "e\u0302\u0323",
  "ḍ̇", "d\u0323\u0307", "d\u0307\u0323", "한", "\u1112\u1161\u11ab", "ö", "o\u0308", "a\u0300\u0301\u0302\u0303\u0304",
  "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e", "\u0301", "\u0301\u0301abc", "ﬃ", "Ⅻ", "①", "x\u20d7",
  "각", "\u1100\u1161\u11a8", "ǖ", "u\u0308\u0304", "\u0958", "\u0915\u093c", "\u00c7", "C\u0327"];
const RTL = ["مرحبا بالعالم", "السلام عليكم", "العربية ١٢٣ ٤٥٦", "שלום עולם", "עברית 123", "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
  "مَرْحَبًا", "\u200fRTL mark\u200f", "\u202bembedded\u202c", "abc \u202eevil\u202c def", "فارسی", "اردو", "ﷺ", "ﻻ"];
const SCRIPTS = ["Привет, мир", "Ελληνικά", "नमस्ते दुनिया", "हिन्दी", "ภาษาไทย", "ქართული", "Հայերեն", "தமிழ்", "বাংলা", "ᚠᚢᚦᚨᚱᚲ",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝", "𝟏𝟐𝟑", "ⅷ", "½", "²³", "∑∫∂", "→⇒⟶", "«guillemets»", "„Anführung“", "‘single’ “double”", "…", "—", "–"];
const WS = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \t \n",
  "\u00a0", "\u00a0\u00a0", "\u200b", "\u3000", "\u2028", "\u2029", "\u2003", "\u2009", "\u202f", "\u205f", "\u000b", "\u000c",
  "\u0085", "\u180e", "\ufeff", "\u200d", "\u200c", "\u2060", "\u1680"];
const DIGITS = ["0", "7", "42", "123", "1234", "12345", "123456", "1234567", "3.14159", "2.718281828459045", "-17", "+1",
  "1e10", "6.022e23", "0x1F", "0b1010", "1,000,000", "1.000.000,00", "2026-11-29", "14:29:00", "$19.99", "€5", "100%",
  "٣٤٥", "१२३", "๑๒๓", "12:00AM", "v1.2.3", "3/4", "007", "9999999999999999999999", "31415926535897932384626433832795028841971"];
const CODE = [
  "def f(x):\n    return x * 2\n",
  "int main(void) {\n\treturn 0;\n}\n",
  "for (int i = 0; i < n; i++) { a[i] += b[i]; }",
  "const x = {a: 1, \"b\": [2, 3]};",
  "if x != None and y >= 3:\n        pass",
  "SELECT * FROM users WHERE id = 42;",
  "<div class=\"main\"><p>Hi &amp; bye</p></div>",
  "#include <stdio.h>\n",
  "fn main() { println!(\"{}\", 1 << 4); }",
  "x => x ** 2 ?? null",
  "```python\nprint('hi')\n```",
  "$ ls -la | grep foo && echo ok || true",
  "{\"role\": \"user\", \"content\": \"hi\"}",
  "a[::-1] + b[1:2]",
  "    indented\n        more\n\tmixed\n",
  "/* comment */ // line\n# hash",
  "<table><tr><td>1</td></tr></table>",
  "λx.λy.x",
  "std::vector<int> v{1,2,3};",
  "@decorator\nclass A(B, metaclass=M): ...",
  "\\begin{equation} E = mc^2 \\end{equation}",
  "a\\nb\\tc",
  "'''doc'''  \"\"\"string\"\"\"",
  "!!!???...,,,;;;:::",
  "~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
];
const URLS = ["https://example.com/path?q=1&r=two#frag", "http://localhost:8080/v1/chat/completions",
  "ftp://files.example.org/a/b/c.tar.gz", "mailto:someone@example.com", "https://例え.jp/パス",
  "https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/tokenizer.json", "www.github.com", "user@host.domain.tld",
  "https://a.b/c%20d%E2%82%AC", "file:///home/user/.cache/x", "git@github.com:owner/repo.git", "192.168.0.1:443"];
// Literal special/added token strings of all three tokenizers, and near misses.
const SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
  "<|repo_name|>", "<|file_sep|>", "<|object_ref_start|>", "<|vision_pad|>", "<|video_pad|>",
  "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
  "<|reserved_special_token_0|>", "<|reserved_special_token_250|>",
  "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>",
  "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<unused0>", "<unused6241>", "<table>", "</table>",
  "<|im_start", "im_start|>", "<|IM_START|>", "< think>", "<think >", "<<think>>", "<|<|im_end|>|>", "<bos", "bos>",
  "<|reserved_special_token_251|>", "<unused6242>"];

const ALL = [WORDS, CJK, EMOJI, COMBINING, RTL, SCRIPTS, WS, DIGITS, CODE, URLS, SPECIALS];

// ---- the corpus -------------------------------------------------------------
const entries = [];
const seen = new Set();
function addText(s) {
  if (seen.has("t:" + s)) return;
  seen.add("t:" + s);
  entries.push({ text: s });
}
function addHex(bytes) {
  const h = Buffer.from(bytes).toString("hex");
  if (seen.has("h:" + h)) return;
  seen.add("h:" + h);
  entries.push({ hex: h });
}

// Fixed edge cases first, so their ids are stable and easy to cite.
[
  "", " ", "  ", "\n", "\n\n", "\r\n", "\t", "a", "Hello, my dog is cute", " 12345 héllo\n\n  wörld 🙂 你好",
  "Hello  world\n\nfoo", "<think>hi</think>", "<start_of_turn>x<eos>", "<|im_start|>user\nHi<|im_end|>\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<bos><start_of_turn>user\nHi<end_of_turn>\n",
  "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "it's", "IT'S", "x's", "''", "'", " '", "'s'",
  "\u00a0", "\u200b", "\u3000", "\u2028", "\u2029", "\ufeff", "\ufeffhello", "\u0000", "a\u0000b", "\u007f", "\u0001\u0002\u001f",
  "\uffff", "\ufffd", "\ufffe", "\u{10ffff}", "\u{e0001}", "\u{f0000}", "\ud7ff", "\ue000",
  rep(" ", 100), rep("\n", 64), rep("\t", 40), rep("\r\n", 30), rep("\u00a0", 20), rep("\u3000", 20),
  rep("a", 60), rep("ab", 300), rep("▁", 40), "▁hello▁world", "Ġhello", "ĊĠ", "<0x41>", "<0x0A>",
].forEach(addText);

// Every pool element alone.
for (const pool of ALL) for (const s of pool) addText(s);
// Every pool element padded by spaces/newlines (the pre-tokenizers treat leading space specially).
for (const pool of ALL) for (const s of pool) { addText(" " + s); addText(s + "\n"); }
// Whitespace runs between words: every whitespace kind, in runs 1..6, between letters and at ends.
for (const w of WS) {
  for (let n = 1; n <= 6; n++) {
    addText("a" + rep(w, n) + "b");
    if (n === 1 || n === 3) { addText(rep(w, n) + "x"); addText("x" + rep(w, n)); }
  }
}
// Whitespace before punctuation/digits/newlines (the "\s+(?!\S)" lookahead).
for (const w of [" ", "  ", "   ", "\t", "\u00a0", "\u3000"])
  for (const t of ["!", "1", "\n", "中", "🙂", "<|im_end|>", "<end_of_turn>", "'s"]) addText("x" + w + t);
// Numbers: every length 1..40 of a fixed digit string, with and without separators.
const PI = "31415926535897932384626433832795028841971693993751";
for (let n = 1; n <= 40; n++) { addText(PI.slice(0, n)); addText("x" + PI.slice(0, n) + "y"); addText(" " + PI.slice(0, n)); }
for (let i = 0; i < 40; i++) addText(String(ri(1e9)) + pick([",", ".", " ", "", "-", "/"]) + String(ri(1e6)));
// Special tokens glued to text, in sequence, and inside words.
for (const s of SPECIALS) {
  addText("Hi" + s + "there");
  addText(s + s);
  addText(" " + s + " ");
  addText("\n" + s + "\n");
}
for (let i = 0; i < 60; i++) {
  let s = "";
  const k = 2 + ri(5);
  for (let j = 0; j < k; j++) s += pick(SPECIALS) + pick(["", " ", "\n", pick(WORDS), pick(CJK), "\n\n"]);
  addText(s);
}
// Combining marks around letters and at string starts.
for (const c of COMBINING) { addText("pre" + c + "post"); addText(c + " " + c); }
// Very long words (1000+ chars) and long runs; kept to a few so the refs stay small.
addText(rep("a", 1000));
addText(rep("abc", 400));
addText(rep("x", 2049));
addText(rep("中", 1000));
addText(rep("🙂", 300));
addText(rep("9", 1200));
addText(rep("é", 600));
addText(rep("e\u0301", 500));
addText(rep("-", 1500));
addText(rep(" ", 1100) + "end");
addText(rep("\n", 1000));
addText(rep("ab ", 500));
{
  let w = ""; while (w.length < 1500) w += pick("abcdefghijklmnopqrstuvwxyz".split("")); addText(w);
  let v = ""; while (v.length < 1200) v += pick(["ka", "zu", "mi", "ro", "n", "tse", "ø", "ß", "ü"]); addText(v);
  let u = ""; while (u.length < 1100) u += pick(CJK); addText(u);
  let e = ""; while (e.length < 1000) e += pick(EMOJI); addText(e);
}
// Random mixtures: 1..12 fragments from random pools, joined by random separators.
const SEP = ["", " ", " ", " ", "\n", "  ", "\t", ", ", ". ", "\r\n", "\u00a0", "-", "_", "/", "\n\n"];
const nMix = 1700;
for (let i = 0; i < nMix; i++) {
  const k = 1 + ri(12);
  let s = "";
  for (let j = 0; j < k; j++) {
    if (j) s += pick(SEP);
    const pool = rnd() < 0.35 ? WORDS : pick(ALL);
    s += pick(pool);
  }
  addText(s);
}
// Sentence-like mixtures with a dominant script.
for (let i = 0; i < 150; i++) {
  const pool = pick([CJK, RTL, SCRIPTS, EMOJI, COMBINING, WORDS]);
  let s = "";
  const k = 3 + ri(10);
  for (let j = 0; j < k; j++) s += (j ? pick([" ", "", ", ", "。", "\n"]) : "") + pick(pool);
  addText(s);
}

// Byte strings that are NOT valid UTF-8.
const enc = (s) => Array.from(Buffer.from(s, "utf8"));
const BAD = [
  [0x80], [0xbf], [0x80, 0x80, 0x80], [0xc0], [0xc1, 0xbf], [0xc0, 0x80], [0xc2], [0xc2, 0x41], [0xe0, 0x80, 0x80],
  [0xe0, 0x9f, 0xbf], [0xe2, 0x82], [0xe2, 0x82, 0x41], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80],
  [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x8f, 0xbf, 0xbf], [0xf0, 0x9f, 0x99], [0xf0, 0x9f], [0xf0], [0xf4, 0x90, 0x80, 0x80],
  [0xf5, 0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfc, 0x84, 0x80, 0x80, 0x80, 0x80], [0xfe], [0xff], [0xfe, 0xff],
  [0xff, 0xfe, 0x41, 0x00], [0x41, 0x80, 0x42], [0xe4, 0xbd, 0xa0, 0xe5, 0xa5], [0xe4, 0xbd, 0xe5, 0xa5, 0xbd],
  [0xc3, 0xa9, 0xa9], [0x20, 0xf0, 0x9f, 0x99, 0x82, 0x99], [0x0a, 0xc0, 0x0a], [0x3c, 0x7c, 0x69, 0x6d, 0x5f, 0xff, 0x7c, 0x3e],
];
for (const b of BAD) addHex(b);
// Valid text with bad bytes spliced in at random positions.
for (let i = 0; i < 120; i++) {
  let bytes = enc(pick([pick(WORDS), pick(CJK), pick(EMOJI), pick(SPECIALS), pick(CODE), pick(RTL)]) + pick(SEP) + pick(pick(ALL)));
  const n = 1 + ri(3);
  for (let j = 0; j < n; j++) {
    const at = ri(bytes.length + 1);
    const bad = pick([[0x80 + ri(64)], [0xc0 + ri(2)], [0xf5 + ri(11)], [0xe0 + ri(16)], [0xf0 + ri(5), 0x80 + ri(64)], [0xed, 0xa0 + ri(32), 0x80]]);
    bytes = bytes.slice(0, at).concat(bad, bytes.slice(at));
  }
  // Only keep the ones that really are invalid UTF-8.
  try { new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes)); } catch { addHex(bytes); }
}
// Truncated multi-byte characters at the end of otherwise valid text.
for (const s of [...EMOJI.slice(0, 10), ...CJK.slice(0, 10), "é", "ệ"]) {
  const b = enc("x" + s);
  for (let cut = 1; cut < b.length - 1; cut++) {
    const t = b.slice(0, b.length - cut);
    try { new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(t)); } catch { addHex(t); }
  }
}

const lines = entries.map((e, id) => JSON.stringify(e.text !== undefined ? { id, text: e.text } : { id, hex: e.hex }));
fs.mkdirSync(path.dirname(OUT), { recursive: true });
fs.writeFileSync(OUT, lines.join("\n") + "\n");
const nHex = entries.filter((e) => e.hex !== undefined).length;
console.error(`make_corpus: ${entries.length} entries (${nHex} invalid UTF-8) -> ${OUT}`);
