// SPDX-License-Identifier: Apache-2.0
// Writes the reference for tokenizer.test.cpp: 1200 generated strings and their ids under the npm package
// gpt-3-encoder (GPT-2's published encoder). Usage: node tokenizer_reference.js <node_modules dir> <out.json>
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'gpt-3-encoder'));

let state = 12345;  // a small deterministic generator (LCG), so the strings are the same on every machine
const rand = n => { state = (state * 1103515245 + 12345) % 2147483648; return state % n; };
const pick = a => a[rand(a.length)];
const words = ['the', 'The', 'shape', 'circle', 'red', 'Question', 'Answer', 'describe', 'image', 'moondream', 'pipeline',
  "don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", 'naïve', 'café', 'Straße', 'Ωμέγα', 'Жук', '中文',
  '日本語', 'hello', 'world', 'GPU', 'x86_64', 'Hello', 'WORLD', 'tensor', 'über', 'façade', 'ﬁne'];
const punct = ['.', ',', '!', '?', ':', ';', '-', '--', '...', '(', ')', '"', "'", '#', '$', '%', '&', '*', '<|', '|>', '@', '🙂', '🚀', '€', '→', '{', '}', '[', ']', '/'];
const spaces = [' ', ' ', ' ', '  ', '   ', '\n', '\n\n', '\t', ' \n', '\r\n', '\u00a0', '    '];
const nums = () => String(rand(100000)).slice(0, 1 + rand(5));
const out = [];
const fixed = ['\n\nQuestion:', '\n\nAnswer:', '\n\nQuestion: What color is the shape?\n\nAnswer:', ' red', 'Hello world',
  '   leading spaces', 'trailing spaces   ', 'a  b   c', "It's 2026's plan", '12345678901', '', ' ', '\n'];
for (const s of fixed) out.push(s);
while (out.length < 1200) {
  let s = '';
  const n = 1 + rand(12);
  for (let i = 0; i < n; ++i) {
    const k = rand(10);
    if (k < 5) s += pick(words);
    else if (k < 7) s += pick(punct);
    else if (k < 8) s += nums();
    else s += pick(spaces);
    if (rand(3) === 0) s += ' ';
  }
  out.push(s);
}
fs.writeFileSync(process.argv[3], JSON.stringify(out.map(text => ({ text, ids: encode(text) }))));
