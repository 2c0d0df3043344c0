// A small 2D RRT motion planner. Lambdas grow trees from different seeds in the same obstacle
// world, share the best path cost through the store, and stop at a target cost, an iteration
// budget or a time budget. Input (optional JSON): {obstacles: [[x0,y0,x1,y1],...], start, goal,
// target, iterations, ms, seed}.
const cfg = lambda.input !== null ? JSON.parse(lambda.input) : {};
const W = 100;
const obstacles = cfg.obstacles || [[20, 0, 30, 70], [45, 30, 55, 100], [70, 0, 80, 60]];
const start = cfg.start || [5, 5], goal = cfg.goal || [95, 95];
const target = cfg.target || 0, iterations = cfg.iterations || 20000, budget = cfg.ms || 3000;
const step = 4;
let s = ((lambda.id + 7) * 2246822519 + (cfg.seed || 0) * 2654435761) >>> 0;
function rand() { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; }
const free = (x, y) => x >= 0 && y >= 0 && x <= W && y <= W && !obstacles.some(o => x >= o[0] && x <= o[2] && y >= o[1] && y <= o[3]);
function segmentFree(a, b) {
  const d = Math.hypot(b[0] - a[0], b[1] - a[1]), n = Math.max(2, Math.ceil(d / 0.25));
  for (let i = 0; i <= n; i++) { const t = i / n; if (!free(a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))) return false; }
  return true;
}
const nodes = [{ p: start, parent: -1, cost: 0 }];
let best = Infinity, bestNode = -1;
const t0 = Date.now();
let it = 0;
for (; it < iterations; it++) {
  const q = rand() < 0.1 ? goal : [rand() * W, rand() * W];
  let near = 0, nd = Infinity;
  for (let i = 0; i < nodes.length; i++) { const d = Math.hypot(nodes[i].p[0] - q[0], nodes[i].p[1] - q[1]); if (d < nd) { nd = d; near = i; } }
  const from = nodes[near].p, k = Math.min(1, step / (nd || 1));
  const p = [from[0] + k * (q[0] - from[0]), from[1] + k * (q[1] - from[1])];
  if (!segmentFree(from, p)) continue;
  // Choose the cheapest parent within reach (RRT*-style), so costs improve with time.
  let parent = near, cost = nodes[near].cost + Math.hypot(p[0] - from[0], p[1] - from[1]);
  for (let i = 0; i < nodes.length; i++) {
    const d = Math.hypot(nodes[i].p[0] - p[0], nodes[i].p[1] - p[1]);
    if (d < 2 * step && nodes[i].cost + d < cost && segmentFree(nodes[i].p, p)) { parent = i; cost = nodes[i].cost + d; }
  }
  nodes.push({ p: p, parent: parent, cost: cost });
  const dg = Math.hypot(goal[0] - p[0], goal[1] - p[1]);
  if (dg < step * 2 && cost + dg < best && segmentFree(p, goal)) { best = cost + dg; bestNode = nodes.length - 1; }
  if (it % 500 === 499) {
    // Each lambda publishes its own best under its own key (no update is ever lost) and reads
    // the others' to learn the global best.
    if (best < Infinity) putJSON("rrt/best/" + lambda.id, { cost: best, lambda: lambda.id });
    if (globalBest() <= target || Date.now() - t0 > budget) break;
  }
}
const path = [];
if (bestNode >= 0) { path.push(goal); for (let i = bestNode; i >= 0; i = nodes[i].parent) path.push(nodes[i].p); path.reverse(); }
if (best < Infinity) putJSON("rrt/best/" + lambda.id, { cost: best, lambda: lambda.id });
put("rrt/done/" + lambda.id, "1");
emit(JSON.stringify({ lambda: lambda.id, cost: best === Infinity ? null : best, nodes: nodes.length, iterations: it, path: path }));
sync();
if (lambda.id === 0) {
  // Wait (bounded) until every lambda has finished; one more barrier then makes every final
  // result visible here, and the shared best is the least of them.
  for (let round = 0; round < 100; round++) {
    let all = true;
    for (let i = 0; i < lambda.count; i++) if (get("rrt/done/" + i) === null) all = false;
    if (all) break;
    sync();
  }
  sync();
  let sb = null;
  for (let i = 0; i < lambda.count; i++) {
    const s = getJSON("rrt/best/" + i);
    if (s !== null && (sb === null || s.cost < sb.cost)) sb = s;
  }
  emit(JSON.stringify({ shared_best: sb }));
}

function globalBest() {
  let g = best;
  for (let i = 0; i < lambda.count; i++) {
    const s = getJSON("rrt/best/" + i);
    if (s !== null && s.cost < g) g = s.cost;
  }
  return g;
}
