// Generates tests/golden/gpt2.json: strings and their GPT-2 token ids from an
// independent implementation, npm js-tiktoken's gpt2 encoding.
//   d=$(mktemp -d) && (cd $d && npm install --silent js-tiktoken@1.0.21) &&
//   node scripts/corpus/make_golden.mjs $d/node_modules > tests/golden/gpt2.json
//
// Invalid UTF-8 cannot be a JS string. For those cases the pieces come from the same
// regex run on a stand-in string (each invalid byte -> U+FFFD, a [^\s\p{L}\p{N}]
// character, which is how flashgpt classifies an invalid byte), and each piece is cut
// at the invalid bytes. This is exact only for bytes that no GPT-2 merge contains
// ("walls", checked below): BPE cannot merge across them, so the valid segments
// between them are encoded independently.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const modules = process.argv[2];
if (!modules) throw new Error("usage: node make_golden.mjs <node_modules dir holding js-tiktoken>");
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { Tiktoken } = require("js-tiktoken/lite");
const gpt2 = require("js-tiktoken/ranks/gpt2");
const enc = new Tiktoken(gpt2.default ?? gpt2);
const version = JSON.parse(fs.readFileSync(path.join(path.resolve(modules), "js-tiktoken/package.json"))).version;

const utf8 = (s) => Buffer.from(s, "utf8");
const cases = [];
function add(name, text, { special = false } = {}) {
  const ids = special ? enc.encode(text, "all") : enc.encode(text);
  cases.push({ name, hex: utf8(text).toString("hex"), special, ids });
}

// --- fixed cases -------------------------------------------------------------------
add("ascii_prose", "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. The quick brown fox jumps over the lazy dog.");
add("code", "int main(int argc, char** argv) {\n\tfor (int i = 0; i < argc; ++i) {\n        printf(\"%s\\n\", argv[i]);  // print\n    }\n    return x->y >= 0 ? a[i] : b->c;\n}\n");
add("python_code", "def f(x):\n    if x:\n        return {'a': [1, 2.5e-3]}  # note\n\n\nclass A(B):\n    pass\n");
add("numbers", "3.14159 1,000,000 2024-11-29 0x1F 12345678901234567890 -42 +7 1e10 $19.99 50% 1st 2nd");
add("unicode_numbers", "x² ½ ¾ Ⅻ ٣٤٥ ४२ ①②");
add("long_spaces", "a" + " ".repeat(50) + "b" + " ".repeat(7) + "\n" + " ".repeat(33));
add("mixed_whitespace", "\t\t\t  \n\n\n   x \t y\u00a0z\u3000w\u2003v  \r\n\r\n");
add("trailing_whitespace", "end of text   \n\n\t ");
add("newlines", "line one\nline two\r\n\r\nline three\n\n\n\nfour\n");
add("contractions_lower", "I'm sure you're right; they've said we'll go, he'd say it's fine, can't won't don't");
add("contractions_upper", "I'M SURE YOU'RE RIGHT; THEY'VE SAID WE'LL GO, HE'D SAY IT'S FINE, CAN'T WON'T DON'T");
add("apostrophes", "'s 't 're 've 'm 'll 'd ''s '''t 'x 'S rock 'n' roll' ' '");
add("accented_latin", "Café naïve façade Ångström Žluťoučký kůň úpěl ďábelské ódy; Größe, señor, œuvre");
add("greek_cyrillic", "Καλημέρα κόσμε — Привет, мир! Ελληνικά");
add("cjk", "日本語のテキスト、中文文本。한국어 텍스트입니다.");
add("emoji", "Hello 👋🏽 world 🌍! Family: 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ❤️");
add("combining_marks", "e\u0301 a\u0308 n\u0303 Z\u0351\u0362a\u0300\u0301\u0302 \u0301start");
add("punctuation_runs", "!!!??? ... ---- ==== <<>> ((()))[]{}; \"quoted\" «guillemets» …");
add("url_email", "See https://example.com/a/b?c=d&e=f#g or mail me@example.org.");
add("special_token", "first document<|endoftext|>second document<|endoftext|>", { special: true });
add("empty", "");
add("single_space", " ");

// --- deterministic random strings from a mixed alphabet ----------------------------
let state = 0x9e3779b9;
function rand(n) {  // xorshift32, so the file is the same on every run
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state % n;
}
const alphabet = [..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
  .concat([" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", "'", "'s", "'t", "'re", "'ll", "'D", ".", ",", "!", "?", "-", "(", ")", "\"", "#", "é", "ñ", "ö", "ß", "Ω", "ж", "中", "文", "日", "ア", "한", "٣", "²", "½", "👋", "🏽", "🌍", "\u0301", "\u0308", "\u00a0", "\u3000", "\u2003", "\r\n", "…", "—", "€"]);
for (let i = 0; i < 200; ++i) {
  let s = "";
  const length = 1 + rand(40);
  for (let k = 0; k < length; ++k) s += alphabet[rand(alphabet.length)];
  add(`random_${i}`, s);
}

// Long words: BPE's merge order matters most there (" seduced" once caught a bug).
add("seduced", " seduced expedient unconstitutionally antidisestablishmentarianism");
const letters = "eeeeeeetttttaaaaooooiiiinnnnsssshhhrrrdddllcumwfgypbvkjxqz";
for (let i = 0; i < 100; ++i) {
  let s = "";
  for (let w = 0, n = 1 + rand(12); w < n; ++w) {
    s += rand(3) ? " " : "";
    for (let k = 0, len = 1 + rand(16); k < len; ++k) s += letters[rand(letters.length)];
  }
  add(`random_words_${i}`, s);
}

// --- invalid UTF-8 -------------------------------------------------------------------
const re = new RegExp(gpt2.pat_str ?? (gpt2.default ?? gpt2).pat_str, "gu");
const walls = new Set([0xc0, 0xc1, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff]);
for (const key of enc.rankMap.keys()) {  // no token longer than one byte contains a wall
  const bytes = key.split(",").map(Number);
  if (bytes.length > 1 && bytes.some((b) => walls.has(b))) throw new Error(`wall byte in token ${key}`);
}
function addInvalid(name, parts) {  // parts: strings and wall bytes (numbers)
  const bytes = Buffer.concat(parts.map((p) => (typeof p === "number" ? Buffer.from([p]) : utf8(p))));
  const standIn = parts.map((p) => (typeof p === "number" ? "\ufffd" : p)).join("");
  const units = parts.flatMap((p) => (typeof p === "number" ? [p] : [...p]));  // bytes or characters
  const ids = [];
  let u = 0;
  for (const m of standIn.matchAll(re)) {
    let segment = "";
    for (const ch of m[0]) {
      const unit = units[u++];
      if (typeof unit === "number") {
        if (segment) ids.push(...enc.encode(segment));
        segment = "";
        ids.push(enc.rankMap.get(String(unit)));
      } else segment += unit;
    }
    if (segment) ids.push(...enc.encode(segment));
  }
  cases.push({ name, hex: bytes.toString("hex"), special: false, ids });
}
addInvalid("invalid_bytes_in_words", ["abc ", 0xff, 0xfe, " def", 0xf8, "!"]);
addInvalid("invalid_bytes_alone", [0xc0, 0xc1, 0xf5, 0xff]);
addInvalid("invalid_bytes_punct", ["hello", 0xfa, "?!", 0xfb, " 'll ", 0xfc, "world"]);
addInvalid("invalid_bytes_space", [" ", 0xff, "  ", 0xfe, "\n", 0xfd]);

process.stdout.write(JSON.stringify({
  generator: "scripts/corpus/make_golden.mjs",
  reference: `js-tiktoken ${version} gpt2, node ${process.versions.node}, Unicode ${process.versions.unicode}`,
  cases,
}, null, 0).replace(/\},\{/g, "},\n{") + "\n");
