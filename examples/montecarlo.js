// Parallel Monte Carlo estimate of pi. Each lambda samples with its own seeded generator,
// publishes its tally; lambda 0 adds them up. Input (optional): samples per lambda.
const samples = lambda.input !== null ? parseInt(lambda.input, 10) : 200000;
let s = (lambda.id + 1) * 2654435761 >>> 0;
function rand() { // xorshift32: deterministic per lambda
  s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
  return s / 4294967296;
}
let inside = 0;
for (let i = 0; i < samples; i++) {
  const x = rand(), y = rand();
  if (x * x + y * y <= 1) inside++;
}
putJSON("mc/" + lambda.id, { inside: inside, total: samples });
sync();
put("mc/done/" + lambda.id, "1");
emit(JSON.stringify({ lambda: lambda.id, estimate: 4 * inside / samples }));
if (lambda.id === 0) {
  const pending = () => { for (let i = 0; i < lambda.count; i++) if (get("mc/done/" + i) === null) return true; return false; };
  while (pending()) sync();
  sync();
  let inAll = 0, all = 0;
  for (let i = 0; i < lambda.count; i++) { const t = getJSON("mc/" + i); inAll += t.inside; all += t.total; }
  emit(JSON.stringify({ pi: 4 * inAll / all, samples: all }));
}
