// A job for the key rotation tests (crates/psl-faas/tests/faas_key_rotation.rs and
// crates/psl/tests/faas_rotation_multiprocess.rs): each lambda writes for at least 800 ms (and
// 200 keys), sync()ing every 50 puts, so that a rotation falls in the middle; lambda 0 then waits
// for every lambda's marker, reads every key back and emits {total, bad}.
const id = lambda.id, n = lambda.count;
let i = 0;
const t0 = Date.now();
while (Date.now() - t0 < 800 || i < 200) {
  put(`k/${id}/${i}`, String(i * 7));
  i++;
  if (i % 50 == 0) sync();
}
put(`count/${id}`, String(i));
sync();
put(`done/${id}`, '1');
sync();
if (id === 0) {
  for (let t = 0; t < 300; t++) {
    let all = true;
    for (let j = 0; j < n; j++) if (get(`done/${j}`) === null) all = false;
    if (all) break;
    sync();
  }
  let total = 0, bad = 0;
  for (let j = 0; j < n; j++) {
    const c = Number(get(`count/${j}`));
    for (let k = 0; k < c; k++) if (get(`k/${j}/${k}`) !== String(k * 7)) bad++;
    total += c;
  }
  emit(JSON.stringify({ total, bad }));
}
