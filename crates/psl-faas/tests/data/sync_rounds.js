// Every lambda writes ROUNDS keys (the input, default 50), each followed by a sync() (which
// returns only once a SYNC covers the write); lambda 0 then waits for every lambda's done
// marker and sums what all of them wrote: lambdas × (0 + 1 + ... + ROUNDS - 1).
const ROUNDS = lambda.input !== null ? Number(lambda.input) : 50;
for (let r = 0; r < ROUNDS; r++) {
  put("n/" + lambda.id + "/" + r, String(r));
  sync();
}
put("done/" + lambda.id, String(ROUNDS));
sync();
if (lambda.id === 0) {
  const pending = () => { for (let i = 0; i < lambda.count; i++) if (get("done/" + i) === null) return true; return false; };
  while (pending()) sync();
  sync();
  let sum = 0, missing = 0;
  for (let i = 0; i < lambda.count; i++)
    for (let r = 0; r < ROUNDS; r++) {
      const v = get("n/" + i + "/" + r);
      if (v === null) missing++; else sum += Number(v);
    }
  emit(JSON.stringify({ sum: sum, missing: missing }));
}
