// Word count: map, then reduce through the shared store.
// Input: text (lambda.input). Lambda i maps lines i, i+N, i+2N, ...; lambda 0 reduces.
// Run: psl run examples/wordcount.js --lambdas 4 --input some.txt
const text = lambda.input !== null ? lambda.input : "the quick brown fox\njumps over the lazy dog\nthe dog barks\nthe fox runs";
const lines = text.split("\n");
const counts = {};
let words = 0;
for (let i = lambda.id; i < lines.length; i += lambda.count) {
  for (const w of lines[i].toLowerCase().match(/[a-z0-9]+/g) || []) {
    counts[w] = (counts[w] || 0) + 1;
    words++;
  }
}
putJSON("wc/map/" + lambda.id, counts);
sync(); // my partial counts are sealed, multicast and covered by a SYNC
put("wc/done/" + lambda.id, "1");
emit("mapped " + words + " words");

if (lambda.id === 0) {
  const pending = () => { for (let i = 0; i < lambda.count; i++) if (get("wc/done/" + i) === null) return true; return false; };
  while (pending()) sync();
  sync(); // every partial count written before a done marker is now here
  const total = {};
  for (let i = 0; i < lambda.count; i++) {
    const part = getJSON("wc/map/" + i);
    for (const w in part) total[w] = (total[w] || 0) + part[w];
  }
  const sorted = {};
  for (const w of Object.keys(total).sort()) sorted[w] = total[w];
  putJSON("wc/result", sorted);
  emit(JSON.stringify(sorted));
}
