//! montecarlo.js and rrt.js through the embedded deployment (wordcount has its own test).
mod common;

#[test]
fn faas_montecarlo_estimates_pi() {
    let d = common::deployment(4, vec![]);
    let p = std::fs::read_to_string(common::examples().join("montecarlo.js")).unwrap();
    let r = common::run(&d, &p, 4, Some("100000"));
    assert!(r.ok, "{:?}", r.lambdas);
    let v: serde_json::Value = serde_json::from_str(r.lambdas[0].emitted.last().unwrap()).unwrap();
    let pi = v["pi"].as_f64().unwrap();
    assert_eq!(v["samples"].as_u64(), Some(400000));
    assert!((pi - std::f64::consts::PI).abs() < 0.02, "pi ~ {pi}");
}

fn free(obs: &[[f64; 4]], x: f64, y: f64) -> bool {
    (0.0..=100.0).contains(&x)
        && (0.0..=100.0).contains(&y)
        && !obs.iter().any(|o| x >= o[0] && x <= o[2] && y >= o[1] && y <= o[3])
}

#[test]
fn faas_rrt_finds_collision_free_paths_and_shares_the_best() {
    let d = common::deployment(3, vec![]);
    let p = std::fs::read_to_string(common::examples().join("rrt.js")).unwrap();
    let obs = [[20.0, 0.0, 30.0, 70.0], [45.0, 30.0, 55.0, 100.0], [70.0, 0.0, 80.0, 60.0]];
    let input = serde_json::json!({"obstacles": obs, "start": [5, 5], "goal": [95, 95], "target": 0, "iterations": 6000, "ms": 4000});
    let r = common::run(&d, &p, 3, Some(&input.to_string()));
    assert!(r.ok, "{:?}", r.lambdas);
    let mut best = f64::INFINITY;
    for l in &r.lambdas {
        let v: serde_json::Value = serde_json::from_str(&l.emitted[0]).unwrap();
        let Some(cost) = v["cost"].as_f64() else { continue };
        let path: Vec<[f64; 2]> = serde_json::from_value(v["path"].clone()).unwrap();
        assert_eq!(path[0], [5.0, 5.0]);
        assert_eq!(*path.last().unwrap(), [95.0, 95.0]);
        let mut len = 0.0;
        for s in path.windows(2) {
            let (a, b) = (s[0], s[1]);
            len += ((b[0] - a[0]).powi(2) + (b[1] - a[1]).powi(2)).sqrt();
            for k in 0..=100 {
                let t = k as f64 / 100.0;
                assert!(free(&obs, a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])), "segment {a:?}-{b:?} collides");
            }
        }
        assert!((len - cost).abs() < 1e-6 * cost.max(1.0) + 1e-6, "reported {cost}, path {len}");
        best = best.min(cost);
    }
    assert!(best.is_finite(), "no lambda found a path");
    assert!(best >= 90.0 * 2f64.sqrt());
    let shared: serde_json::Value = serde_json::from_str(r.lambdas[0].emitted.last().unwrap()).unwrap();
    let sb = shared["shared_best"]["cost"].as_f64().unwrap();
    assert!((sb - best).abs() < 1e-9, "shared best {sb} vs best {best}");
    // Every lambda's final tree came back to lambda 0 as bytes, whole: 24 bytes of header and
    // 24 per node, as many nodes as the lambda grew.
    let trees = shared["trees"].as_array().unwrap();
    assert_eq!(trees.len(), 3);
    for (t, l) in trees.iter().zip(&r.lambdas) {
        let v: serde_json::Value = serde_json::from_str(&l.emitted[0]).unwrap();
        let n = v["nodes"].as_u64().unwrap();
        assert_eq!(t["nodes"].as_u64(), Some(n.min(40000)), "{t} vs {v}");
        assert_eq!(t["bytes"].as_u64(), Some(24 + 24 * n.min(40000)), "{t}");
    }
}
