//! The documents a user reads first: the README is written for a user of any store (issue 34, item 8), and every
//! link in the README, DESIGN.md and docs/BENCHMARKS.md leads to a file and a heading that exist.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The headings of a Markdown text: (level, title).
fn headings(text: &str) -> Vec<(usize, &str)> {
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let level = line.chars().take_while(|c| *c == '#').count();
            let title = line.get(level..)?.strip_prefix(' ')?;
            (1..=6).contains(&level).then_some((level, title.trim()))
        })
        .collect()
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` on repeats.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashSet<String> = HashSet::new();
    for (_, title) in headings(text) {
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links `[text](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_in_the_docs_leads_to_a_file_and_a_heading_that_exist() {
    let mut broken = Vec::new();
    for doc in ["README.md", "DESIGN.md", "docs/BENCHMARKS.md"] {
        let path = root().join(doc);
        let text = read(&path);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{doc}: {link}: no file {}", target.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if target.extension().is_some_and(|ext| ext == "md")
                    && !anchors(&read(&target)).contains(anchor)
                {
                    broken.push(format!("{doc}: {link}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_readme_is_written_for_a_user_of_any_store() {
    let text = read(&root().join("README.md"));
    let lines = text.lines().count();
    assert!(
        lines < 700,
        "the README has {lines} lines: move detail to DESIGN.md or docs/BENCHMARKS.md"
    );

    // The order a newcomer needs: what it is, which store, how to start, each store, the command, what it promises.
    let sections: Vec<&str> = headings(&text)
        .into_iter()
        .filter(|(level, _)| *level == 2)
        .map(|(_, title)| title)
        .collect();
    let wanted = [
        "Contents",
        "Choose your store",
        "Library quickstart",
        "Redis",
        "etcd",
        "ZooKeeper",
        "PostgreSQL and MySQL/MariaDB",
        "The `leasehold` command",
        "Guarantees",
        "Tests",
        "Benchmarks",
    ];
    let positions: Vec<Option<usize>> = wanted
        .iter()
        .map(|want| sections.iter().position(|s| s == want))
        .collect();
    assert!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|pair| pair[0] < pair[1]),
        "the README's sections should include, in this order, {wanted:?}; they are {sections:?}"
    );
    assert_eq!(
        sections[1], "Choose your store",
        "the choice of store comes right after the contents"
    );

    // The stores table, between the markers the generated block uses, one column per store.
    let begin = text
        .find("<!-- stores-table:begin -->")
        .expect("the stores-table:begin marker");
    let end = text
        .find("<!-- stores-table:end -->")
        .expect("the stores-table:end marker");
    let table = &text[begin..end];
    for store in ["Redis", "etcd", "ZooKeeper", "PostgreSQL", "MySQL"] {
        assert!(
            table.contains(store),
            "the stores table has no column for {store}"
        );
    }
    for row in ["`Cargo.toml`", "URL", "default lease", "a crashed holder"] {
        assert!(
            table
                .lines()
                .any(|line| line.starts_with(&format!("| {row}"))),
            "the stores table has no {row} row"
        );
    }

    // Benchmark logs live in docs/BENCHMARKS.md; the README keeps one summary table.
    assert!(
        !text.contains("acquires/s    p50"),
        "a benchmark log is in the README: move it to docs/BENCHMARKS.md"
    );

    // The Tests section says what running everything costs and what it installs.
    let tests = &text[text.find("\n## Tests").unwrap()..];
    let tests = &tests[..tests[1..].find("\n## ").map_or(tests.len(), |at| at + 1)];
    for must in [
        "scripts/test.sh",
        "minutes",
        "apt-get",
        "sudo",
        "Java",
        "pip",
    ] {
        assert!(
            tests.contains(must),
            "the Tests section does not say {must:?}"
        );
    }
}
