// A small 2D RRT motion planner. Lambdas grow trees from different seeds in the same obstacle
// world, share their trees through the store as bytes, graft the best path another lambda found
// into their own tree (and improve on it), and stop at a target cost, an iteration budget or a
// time budget. Input (optional JSON): {obstacles: [[x0,y0,x1,y1],...], start, goal, target,
// iterations, ms, seed}.
//
// A shared tree, `rrt/tree/<id>`, is a Uint8Array over Float64 values: [nodes, best node (-1:
// none), best cost (0: none), then x, y, parent for each node] (a parent precedes its children,
// so any prefix is a tree; at most TREE_NODES_MAX nodes, under the store's 1 MiB value limit).
const cfg = lambda.input !== null ? JSON.parse(lambda.input) : {};
const W = 100;
const obstacles = cfg.obstacles || [[20, 0, 30, 70], [45, 30, 55, 100], [70, 0, 80, 60]];
const start = cfg.start || [5, 5], goal = cfg.goal || [95, 95];
const target = cfg.target || 0, iterations = cfg.iterations || 20000, budget = cfg.ms || 3000;
const step = 4;
const TREE_NODES_MAX = 40000;
let s = ((lambda.id + 7) * 2246822519 + (cfg.seed || 0) * 2654435761) >>> 0;
function rand() { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; }
const free = (x, y) => x >= 0 && y >= 0 && x <= W && y <= W && !obstacles.some(o => x >= o[0] && x <= o[2] && y >= o[1] && y <= o[3]);
function segmentFree(a, b) {
  const d = Math.hypot(b[0] - a[0], b[1] - a[1]), n = Math.max(2, Math.ceil(d / 0.25));
  for (let i = 0; i <= n; i++) { const t = i / n; if (!free(a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))) return false; }
  return true;
}
const nodes = [{ p: start, parent: -1, cost: 0 }];
let best = Infinity, bestNode = -1, grafted = 0;
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
    // Each lambda publishes its own best and its tree under its own keys (no update is ever
    // lost), reads the others' bests to learn the global best, and grafts the best path of a
    // lambda that did better into its own tree.
    if (best < Infinity) putJSON("rrt/best/" + lambda.id, { cost: best, lambda: lambda.id });
    put("rrt/tree/" + lambda.id, treeBytes());
    const g = globalBest();
    if (g.lambda !== lambda.id && g.cost < best) graft(g.lambda);
    if (Math.min(best, g.cost) <= target || Date.now() - t0 > budget) break;
  }
}
const path = [];
if (bestNode >= 0) { path.push(goal); for (let i = bestNode; i >= 0; i = nodes[i].parent) path.push(nodes[i].p); path.reverse(); }
if (best < Infinity) putJSON("rrt/best/" + lambda.id, { cost: best, lambda: lambda.id });
put("rrt/tree/" + lambda.id, treeBytes());
put("rrt/done/" + lambda.id, "1");
emit(JSON.stringify({ lambda: lambda.id, cost: best === Infinity ? null : best, nodes: nodes.length, iterations: it, grafted: grafted, path: path }));
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
  // Every final tree, read back as bytes: how many nodes the lambdas shared.
  const trees = [];
  for (let i = 0; i < lambda.count; i++) {
    const t = readTree(i);
    trees.push(t === null ? null : { nodes: t.n, best_node: t.bestNode, bytes: t.bytes });
  }
  emit(JSON.stringify({ shared_best: sb, trees: trees }));
}

function globalBest() {
  let g = { cost: best, lambda: lambda.id };
  for (let i = 0; i < lambda.count; i++) {
    const s = getJSON("rrt/best/" + i);
    if (s !== null && s.cost < g.cost) g = s;
  }
  return g;
}

function treeBytes() {
  const n = Math.min(nodes.length, TREE_NODES_MAX);
  const f = new Float64Array(3 + 3 * n);
  f[0] = n; f[1] = bestNode < n ? bestNode : -1; f[2] = bestNode < n && best < Infinity ? best : 0;
  for (let i = 0; i < n; i++) { f[3 + 3 * i] = nodes[i].p[0]; f[4 + 3 * i] = nodes[i].p[1]; f[5 + 3 * i] = nodes[i].parent; }
  return new Uint8Array(f.buffer);
}

// Another lambda's tree, or null if it has none yet or it is not a well-formed tree.
function readTree(i) {
  const b = get("rrt/tree/" + i);
  if (!(b instanceof Uint8Array) || b.length < 24 || b.length % 8 !== 0) return null;
  const f = new Float64Array(b.slice().buffer);
  const n = f[0], bestNode = f[1];
  if (!Number.isInteger(n) || f.length !== 3 + 3 * n || !Number.isInteger(bestNode) || bestNode >= n) return null;
  return { f: f, n: n, bestNode: bestNode, bytes: b.length };
}

// Adds lambda i's best path (every node from its root to its best node) to this tree, with
// the costs recomputed here and every segment checked again; then the goal is one step away.
function graft(i) {
  const t = readTree(i);
  if (t === null || t.bestNode < 1) return;
  const chain = [];
  for (let k = t.bestNode; k > 0; ) {
    chain.push([t.f[3 + 3 * k], t.f[4 + 3 * k]]);
    const parent = t.f[5 + 3 * k];
    if (!Number.isInteger(parent) || parent < 0 || parent >= k) return; // parents come first
    k = parent;
  }
  chain.reverse();
  let cost = 0, from = nodes[0].p;
  const added = [];
  for (const p of chain) {
    if (!segmentFree(from, p)) return;
    cost += Math.hypot(p[0] - from[0], p[1] - from[1]);
    added.push({ p: p, parent: added.length === 0 ? 0 : nodes.length + added.length - 1, cost: cost });
    from = p;
  }
  const last = added[added.length - 1];
  const dg = Math.hypot(goal[0] - last.p[0], goal[1] - last.p[1]);
  if (last.cost + dg >= best || !segmentFree(last.p, goal)) return;
  for (const a of added) nodes.push(a);
  best = last.cost + dg; bestNode = nodes.length - 1;
  grafted += added.length;
}
