//! `psl report`'s HTML page, loaded in a real headless browser (Debian's `chromium`, installed
//! by `scripts/test-all.sh`): the page loads with no console message at all (it has no script,
//! so any message is the browser complaining, e.g. about a resource it may not load), and every
//! image decodes to a non-empty bitmap. The report is drawn with `psl report --render-only` from
//! a small synthetic `results.json`, so no benchmark runs. The screenshot is kept as a test
//! artifact: `target/tmp/report_browser/report.png`.
//!
//! The check itself is tested to fail: the same page with one image's bytes broken is rejected.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A results.json with two sections' worth of made-up numbers (SCL puts and RRT*).
fn synthetic_results() -> serde_json::Value {
    let mut scl = serde_json::Map::new();
    for (w, b, u) in
        [(1, 900_000.0, 15_000.0), (2, 700_000.0, 12_000.0), (4, 500_000.0, 9_000.0), (8, 300_000.0, 5_000.0)]
    {
        scl.insert(format!("puts_per_s_w{w}"), b.into());
        scl.insert(format!("puts_per_s_u{w}"), u.into());
    }
    let mut rrt = serde_json::Map::new();
    rrt.insert("lambdas".into(), serde_json::json!([1, 2, 4, 8]));
    for (l, s, b) in [(1, 2000.0, 1500.0), (2, 1500.0, 1200.0), (4, 1100.0, 900.0), (8, 900.0, 800.0)] {
        rrt.insert(format!("scl_ms_p50_l{l}"), serde_json::json!(s));
        rrt.insert(format!("baseline_ms_p50_l{l}"), serde_json::json!(b));
        rrt.insert(format!("ratio_l{l}"), serde_json::json!(s / b));
    }
    let case = |id: &str, args: &[&str], result: serde_json::Value| {
        serde_json::json!({
            "id": id, "section": id, "bench": id, "args": args, "estimate_s": 1.0, "status": "ok",
            "error": null, "seconds": 1.0, "load_average_before": 0.5, "load_average_after": 0.5, "result": result,
        })
    };
    serde_json::json!({
        "generated": "2026-01-01", "commit": "synthetic", "mode": "tiny",
        "note": "synthetic numbers for the browser test",
        "machine": {"cpu_model": "test machine", "cores": 2, "profile": "debug"},
        "load_average_start": 0.5, "load_average_end": 0.5,
        "cases": [
            case("scl", &["--cases", "w1,w2,w4,w8,u1,u2,u4,u8"], serde_json::Value::Object(scl)),
            case("rrt", &["--reps", "1"], serde_json::Value::Object(rrt)),
        ],
    })
}

/// Appended to a copy of the page: after `load`, writes how many images there are and which
/// did not decode into the DOM, which `--dump-dom` then prints (the script's own text holds
/// the marker too, hence the element's id in the match).
const PROBE: &str = "<script>window.addEventListener('load',()=>{const im=[...document.images];\
const bad=im.filter(i=>!(i.complete&&i.naturalWidth>0&&i.naturalHeight>0)).map(i=>i.alt);\
const p=document.createElement('pre');p.id='psl-check';\
p.textContent='PSL-CHECK images='+im.length+' broken='+bad.length+' ['+bad.join(';')+'] END';\
document.body.appendChild(p);});</script>";

/// What the browser saw.
#[derive(Debug)]
struct Seen {
    images: usize,
    broken: Vec<String>,
    console: Vec<String>,
}

/// Loads `page` (a copy of it with [`PROBE`] appended) in headless chromium, screenshotting it
/// to `shot`.
fn load_in_chromium(page: &Path, shot: &Path) -> Seen {
    let html = std::fs::read_to_string(page).expect("the page");
    let probed = page.with_file_name("probed.html");
    std::fs::write(&probed, html.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox", // CI runs as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--window-size=1200,2400",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", probed.display()))
        .stdout(std::fs::File::create(page.with_file_name("dom.txt")).unwrap())
        .stderr(std::fs::File::create(page.with_file_name("chromium.stderr")).unwrap())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting chromium ({e}); scripts/test-all.sh installs it (apt-get install chromium)")
        });
    // Bounded: a browser that hangs fails the test rather than the suite.
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let dom = std::fs::read_to_string(page.with_file_name("dom.txt")).unwrap();
    let stderr = std::fs::read_to_string(page.with_file_name("chromium.stderr")).unwrap();
    assert!(status.success(), "chromium failed ({status}): {stderr}");
    let line = dom
        .lines()
        .find_map(|l| l.split_once("id=\"psl-check\">PSL-CHECK ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("the probe did not run (page did not load?); DOM: {dom}\nstderr: {stderr}"));
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_default().to_string();
    let broken_list = line.split_once('[').and_then(|(_, r)| r.split_once("] END")).map(|(b, _)| b).unwrap_or_default();
    Seen {
        images: field("images=").parse().expect("image count"),
        broken: broken_list.split(';').filter(|s| !s.is_empty()).map(String::from).collect(),
        // Chromium logs every console message (any level) as `...:CONSOLE...] "text", source: ...`.
        console: stderr.lines().filter(|l| l.contains(":CONSOLE")).map(String::from).collect(),
    }
}

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report_browser");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn report_html_loads_cleanly_and_every_image_renders() {
    let art = artifacts();
    let dir = art.join("report");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(&synthetic_results()).unwrap()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_psl-tools"))
        .args(["report", "--render-only", "--out"])
        .arg(&dir)
        .output()
        .expect("psl-tools runs");
    assert!(
        o.status.success(),
        "psl report --render-only failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let page = dir.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    let inlined = html.matches("src=\"data:image/png;base64,").count();
    assert!(inlined >= 2, "expected the SCL and RRT* plots inline, found {inlined} images");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "the page must be self-contained");

    let shot = art.join("report.png");
    let seen = load_in_chromium(&page, &shot);
    assert!(seen.console.is_empty(), "console messages: {:#?}", seen.console);
    assert_eq!(seen.images, inlined, "{seen:?}");
    assert!(seen.broken.is_empty(), "images that did not render: {:?}", seen.broken);
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot of {} bytes", png.len());

    // The check must be able to fail: break one image's bytes (keep the data URI well formed)
    // and load the page again.
    let broken_page = art.join("broken").join("report.html");
    std::fs::create_dir_all(broken_page.parent().unwrap()).unwrap();
    let at = html.find("base64,").unwrap() + "base64,".len();
    let mut bad = html.clone();
    bad.replace_range(at..at + 64, &"A".repeat(64));
    std::fs::write(&broken_page, bad).unwrap();
    let seen = load_in_chromium(&broken_page, &art.join("broken.png"));
    assert_eq!(seen.broken.len(), 1, "a corrupt PNG must be caught: {seen:?}");
}
