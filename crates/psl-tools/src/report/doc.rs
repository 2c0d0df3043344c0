//! The report as a list of blocks, rendered twice: Markdown (`report.md`, PNGs beside it) and
//! one self-contained HTML page (`report.html`, every image inline as a base64 data URI, no
//! script, no outside resource).

use base64::Engine;
use std::path::Path;

pub enum Block {
    Heading(u8, String),
    Para(String),
    /// A table: header cells, then rows.
    Table(Vec<String>, Vec<Vec<String>>),
    /// A PNG in the output directory (file name) and its alternative text.
    Image(String, String),
    /// Preformatted text (commands).
    Code(String),
    List(Vec<String>),
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub fn markdown(blocks: &[Block]) -> String {
    let mut o = String::new();
    for b in blocks {
        match b {
            Block::Heading(l, t) => o += &format!("{} {t}\n\n", "#".repeat(*l as usize)),
            Block::Para(t) => o += &format!("{t}\n\n"),
            Block::Table(h, rows) => {
                o += &format!("| {} |\n", h.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | "));
                o += &format!("|{}\n", " --- |".repeat(h.len()));
                for r in rows {
                    o += &format!("| {} |\n", r.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | "));
                }
                o += "\n";
            }
            Block::Image(f, alt) => o += &format!("![{}]({f})\n\n", md_cell(alt)),
            Block::Code(t) => o += &format!("```sh\n{t}\n```\n\n"),
            Block::List(items) => {
                for i in items {
                    o += &format!("- {i}\n");
                }
                o += "\n";
            }
        }
    }
    o
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Inline Markdown the blocks use: `code` spans and **bold**.
fn inline(s: &str) -> String {
    let e = esc(s);
    let mut o = String::new();
    let mut code = false;
    for (i, part) in e.split('`').enumerate() {
        if i > 0 {
            o += if code { "</code>" } else { "<code>" };
            code = !code;
        }
        if code {
            o += part;
        } else {
            let mut bold = false;
            for (j, p) in part.split("**").enumerate() {
                if j > 0 {
                    o += if bold { "</strong>" } else { "<strong>" };
                    bold = !bold;
                }
                o += p;
            }
            if bold {
                o += "</strong>";
            }
        }
    }
    if code {
        o += "</code>";
    }
    o
}

const CSS: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}\
th{background:#f0f0f0}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}\
code,pre{background:#f6f6f6;padding:1px 4px}pre{padding:0.6em;overflow-x:auto}h1,h2{border-bottom:1px solid #ddd}";

/// The HTML page; images are read from `dir` and inlined.
pub fn html(title: &str, blocks: &[Block], dir: &Path) -> std::io::Result<String> {
    let mut o = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <link rel=\"icon\" href=\"data:,\"><style>{CSS}</style></head><body>\n",
        esc(title)
    );
    for b in blocks {
        match b {
            Block::Heading(l, t) => o += &format!("<h{l}>{}</h{l}>\n", inline(t)),
            Block::Para(t) => o += &format!("<p>{}</p>\n", inline(t)),
            Block::Table(h, rows) => {
                o += "<table><thead><tr>";
                for c in h {
                    o += &format!("<th>{}</th>", inline(c));
                }
                o += "</tr></thead><tbody>\n";
                for r in rows {
                    o += "<tr>";
                    for c in r {
                        o += &format!("<td>{}</td>", inline(c));
                    }
                    o += "</tr>\n";
                }
                o += "</tbody></table>\n";
            }
            Block::Image(f, alt) => {
                let bytes = std::fs::read(dir.join(f))?;
                let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                o += &format!("<figure><img src=\"data:image/png;base64,{b64}\" alt=\"{}\"></figure>\n", esc(alt));
            }
            Block::Code(t) => o += &format!("<pre><code>{}</code></pre>\n", esc(t)),
            Block::List(items) => {
                o += "<ul>";
                for i in items {
                    o += &format!("<li>{}</li>", inline(i));
                }
                o += "</ul>\n";
            }
        }
    }
    o += "</body></html>\n";
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_markup_and_escaping() {
        assert_eq!(inline("a `b<c>` **d** e"), "a <code>b&lt;c&gt;</code> <strong>d</strong> e");
        assert_eq!(inline("x ** y"), "x <strong> y</strong>");
        let md = markdown(&[Block::Table(vec!["a|b".into()], vec![vec!["1".into()]])]);
        assert!(md.contains("a\\|b"));
    }

    #[test]
    fn html_inlines_images() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.png"), b"\x89PNG").unwrap();
        let h = html("t", &[Block::Image("x.png".into(), "alt".into())], d.path()).unwrap();
        assert!(h.contains("data:image/png;base64,iVBORw"));
        assert!(!h.contains("x.png"));
    }
}
