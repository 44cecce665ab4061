// Tokenizer throughput of js-tiktoken (gpt2) on one text file, single thread, for
// BENCHMARKS.md; also writes the ids so they can be compared with flashgpt's.
//   d=$(mktemp -d) && (cd $d && npm install --silent js-tiktoken@1.0.21)
//   node scripts/corpus/bench_js_tiktoken.mjs $d/node_modules cache/corpus/sotu.txt [ids.txt]
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [modules, file, idsOut] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { Tiktoken } = require("js-tiktoken/lite");
const gpt2 = require("js-tiktoken/ranks/gpt2");
const enc = new Tiktoken(gpt2.default ?? gpt2);

const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
// As `flashgpt prepare` reads it: the newline that ends the file ends the last document.
const docs = text.replace(/\n$/, "").split("\n<|endoftext|>\n");
const start = process.hrtime.bigint();
const ids = [];
for (const doc of docs) {
  ids.push(50256);
  for (const id of enc.encode(doc)) ids.push(id);
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
console.log(`js-tiktoken: ${(bytes / 1e6).toFixed(1)} MB, ${ids.length} tokens in ${seconds.toFixed(2)} s: ` +
            `${(bytes / 1e6 / seconds).toFixed(2)} MB/s, ${(ids.length / 1e6 / seconds).toFixed(2)}M tokens/s (1 thread)`);
if (idsOut) fs.writeFileSync(idsOut, ids.join("\n") + "\n");
