//! Bad input and unreachable servers: the documented exit statuses, one line on stderr, never a panic.

use leasehold::redis;
use leasehold_tests::{RedisServer, TempDir};

use crate::{finish, leasehold, one_error_line, SOON};

#[test]
fn bad_input_exits_2_with_one_line() {
    // No server runs here: usage errors must be found before connecting.
    let long = "n".repeat(leasehold::MAX_NAME_LEN + 1);
    let url = "redis://127.0.0.1:1";
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("no command", vec![]),
        ("unknown command", vec!["frobnicate"]),
        ("unknown flag", vec!["run", "--bogus", "n", "--", "true"]),
        ("missing name and program", vec!["run"]),
        ("missing program", vec!["run", "n"]),
        ("nothing after --", vec!["run", "n", "--"]),
        ("nothing after the name", vec!["run", "--", "n"]),
        (
            "a program and --command",
            vec!["run", "-c", "true", "n", "true"],
        ),
        ("empty name", vec!["run", "", "--", "true"]),
        ("name too long", vec!["run", &long, "--", "true"]),
        ("name starting with }", vec!["run", "}x", "--", "true"]),
        ("zero ttl", vec!["run", "--ttl", "0s", "n", "--", "true"]),
        (
            "negative ttl",
            vec!["run", "--ttl", "-5s", "n", "--", "true"],
        ),
        (
            "ttl without unit",
            vec!["run", "--ttl", "30", "n", "--", "true"],
        ),
        (
            "unknown unit",
            vec!["run", "--ttl", "3x", "n", "--", "true"],
        ),
        (
            "not a number",
            vec!["run", "--ttl", "soon", "n", "--", "true"],
        ),
        (
            "ttl above 30 days",
            vec!["run", "--ttl", "30d1s", "n", "--", "true"],
        ),
        (
            "absurd ttl",
            vec!["run", "--ttl", "100000h", "n", "--", "true"],
        ),
        (
            "ttl below the minimum",
            vec!["run", "--ttl", "1ms", "n", "--", "true"],
        ),
        (
            "negative wait",
            vec!["run", "--wait=-1s", "n", "--", "true"],
        ),
        (
            "bad kill-after",
            vec!["run", "--kill-after", "later", "n", "--", "true"],
        ),
        (
            "nonblock and wait",
            vec!["run", "--nonblock", "--wait", "1s", "n", "--", "true"],
        ),
        (
            "conflict code too big",
            vec!["run", "--conflict-exit-code", "256", "n", "--", "true"],
        ),
        (
            "malformed url",
            vec!["run", "--redis", "not a url", "n", "--", "true"],
        ),
        (
            "wrong scheme",
            vec!["run", "--redis", "http://127.0.0.1:6379", "n", "--", "true"],
        ),
        ("status without name", vec!["status"]),
        ("status with empty name", vec!["status", "", "--redis", url]),
        (
            "status name too long",
            vec!["status", &long, "--redis", url],
        ),
        ("status malformed url", vec!["status", "n", "--redis", "::"]),
        (
            "release without --force",
            vec!["release", "n", "--redis", url],
        ),
        (
            "release name too long",
            vec!["release", "--force", &long, "--redis", url],
        ),
        ("demo with an argument", vec!["demo", "extra"]),
        ("demo malformed url", vec!["demo", "--redis", "not a url"]),
    ];
    for (what, args) in cases {
        let (code, stdout, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(2), "{what}: {stderr}");
        assert_eq!(stdout, "", "{what}");
        one_error_line(&stderr);
    }
}

#[test]
fn release_without_force_says_what_is_missing() {
    let (_, _, stderr) = finish(leasehold(&["release", "jobs"]), SOON);
    assert!(one_error_line(&stderr).contains("--force"), "{stderr}");
}

#[test]
fn help_and_version_exit_0() {
    for command in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["release", "--help"],
        &["demo", "--help"],
    ] {
        let (code, stdout, stderr) = finish(leasehold(command), SOON);
        assert_eq!(code, Some(0), "{command:?}: {stderr}");
        assert!(stdout.contains("Usage: leasehold"), "{command:?}");
        assert!(stdout.contains("Examples:"), "{command:?} has no examples");
    }
    let (code, stdout, _) = finish(leasehold(&["--version"]), SOON);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("leasehold "), "{stdout}");
}

#[test]
fn an_unreachable_server_exits_69() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    for args in [
        vec!["run", "--redis", &url, "n", "--", "true"],
        vec!["status", "--redis", &url, "n"],
        vec!["release", "--redis", &url, "--force", "n"],
    ] {
        let (code, stdout, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(69), "{args:?}: {stderr}");
        assert_eq!(stdout, "");
        let line = one_error_line(&stderr);
        assert!(
            line.starts_with(&format!("leasehold: cannot connect to Redis at {url}: ")),
            "{stderr}"
        );
        // The cause is said once (the library's error, the RedisError and the I/O error all hold it).
        assert_eq!(line.matches("Connection refused").count(), 1, "{stderr}");
    }
}

#[test]
fn refused_credentials_exit_69_without_showing_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "right"]);
    for url in [
        format!("redis://:wrong@127.0.0.1:{}", server.port()),
        format!("redis://127.0.0.1:{}", server.port()),
    ] {
        let (code, _, stderr) = finish(
            leasehold(&["run", "--redis", &url, "n", "--", "true"]),
            SOON,
        );
        assert_eq!(code, Some(69), "{url}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(!line.contains("wrong"), "{line}");
    }
    let dir = TempDir::new("cli-unix-pass");
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().unwrap();
    let _unix = RedisServer::start_with(&["--unixsocket", socket, "--requirepass", "right"]);
    for url in [
        format!("unix://{socket}?pass=wrong"),
        format!("redis+unix://{socket}?db=1&pass=wrong&user=default"),
    ] {
        let (code, _, stderr) = finish(leasehold(&["status", "--redis", &url, "n"]), SOON);
        assert_eq!(code, Some(69), "{url}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(!line.contains("wrong"), "{line}");
        assert!(line.contains("pass=***"), "{line}");
    }
    let good = format!("redis://:right@127.0.0.1:{}", server.port());
    let (code, _, _) = finish(
        leasehold(&["run", "--redis", &good, "n", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(0));
}

#[test]
fn the_url_can_come_from_the_environment() {
    let server = RedisServer::start();
    let mut command = leasehold(&["run", "env-url", "--", "true"]);
    command.env("LEASEHOLD_STORE", server.url());
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    // The older variable still works, and the newer one wins over it.
    let mut command = leasehold(&["run", "env-url", "--", "true"]);
    command.env("LEASEHOLD_REDIS_URL", server.url());
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let mut command = leasehold(&["run", "env-url", "--", "true"]);
    command
        .env("LEASEHOLD_STORE", server.url())
        .env("LEASEHOLD_REDIS_URL", "redis://127.0.0.1:1");
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(0), "LEASEHOLD_STORE should win: {stderr}");
}

#[test]
fn the_store_option_and_its_older_name_are_one_option() {
    let server = RedisServer::start();
    let url = server.url();
    for option in ["--store", "--redis"] {
        let (code, _, stderr) = finish(
            leasehold(&["run", option, &url, "one-option", "--", "true"]),
            SOON,
        );
        assert_eq!(code, Some(0), "{option}: {stderr}");
    }
    // Given twice under both names, it is two URLs: a quorum needs 3, so this is refused as one.
    let (code, _, stderr) = finish(
        leasehold(&["status", "--store", &url, "--redis", &url, "one-option"]),
        SOON,
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--store given 2 times"), "{stderr}");
}

#[test]
fn a_key_that_is_not_a_lock_exits_65_and_is_left_alone() {
    let server = RedisServer::start();
    let _: () = redis::cmd("SET")
        .arg("leasehold:{foreign}")
        .arg("someone else's")
        .query(&mut server.connection())
        .unwrap();
    let url = server.url();
    for args in [
        vec![
            "run",
            "--redis",
            &url,
            "--nonblock",
            "foreign",
            "--",
            "true",
        ],
        vec!["status", "--redis", &url, "foreign"],
        vec!["release", "--redis", &url, "--force", "foreign"],
    ] {
        let (code, _, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(65), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(
            line.contains("not a leasehold lock")
                && line.contains("it holds the string \"someone else's\""),
            "{stderr}"
        );
    }
    let value: String = redis::cmd("GET")
        .arg("leasehold:{foreign}")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(value, "someone else's");
}

#[test]
fn help_names_every_exit_status_and_the_help_subcommand_works() {
    let (code, stdout, _) = finish(leasehold(&["help", "run"]), SOON);
    assert_eq!(code, Some(0));
    for status in ["2 ", "65 ", "69 ", "70 ", "75 ", "76 ", "126 ", "127 "] {
        assert!(
            stdout
                .lines()
                .any(|line| line.trim_start().starts_with(status)),
            "exit status {status}missing from:\n{stdout}"
        );
    }
}

#[test]
fn a_wrong_scheme_names_the_nearest_and_every_store() {
    let cases = [
        (
            "postgress://app:hunter2@127.0.0.1:1/db",
            "leasehold: postgress://app:***@127.0.0.1:1/db: the scheme \"postgress\" is not one leasehold knows (did \
             you mean postgres://?); this build takes",
        ),
        (
            "postgress://app@127.0.0.1:1/db",
            "leasehold: postgress://app@127.0.0.1:1/db: the scheme \"postgress\" is not one leasehold knows (did you \
             mean postgres://?); this build takes",
        ),
        (
            "http://127.0.0.1:2379",
            "leasehold: http://127.0.0.1:2379: the scheme \"http\" is not one leasehold knows (did you mean \
             etcd://?); this build takes",
        ),
    ];
    for (url, starts) in cases {
        for command in [
            vec!["status", "--store", url, "jobs"],
            vec!["run", "--store", url, "jobs", "--", "true"],
        ] {
            let (code, _, stderr) = finish(leasehold(&command), SOON);
            assert_eq!(code, Some(2), "{command:?}: {stderr}");
            let line = one_error_line(&stderr);
            assert!(line.starts_with(starts), "{command:?}: {line}");
            assert!(line.ends_with("mysql://, mariadb://"), "{line}");
            assert!(
                !line.contains("not a Redis URL") && !line.contains("hunter2"),
                "{line}"
            );
        }
    }
}

#[test]
fn an_empty_store_url_says_so() {
    let (code, _, stderr) = finish(
        leasehold(&["run", "--store", "", "jobs", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(2));
    assert!(
        one_error_line(&stderr).contains("the store URL is empty"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_keep_clap_s_did_you_mean() {
    let cases = [
        (
            &["run", "--nonblok", "n", "true"][..],
            "did you mean --nonblock?",
        ),
        (&["stat", "n"], "did you mean status?"),
        (&["status", "--jsn", "n"], "did you mean --json?"),
        (&["completions", "fsh"], "did you mean fish?"),
    ];
    for (args, tip) in cases {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(one_error_line(&stderr).contains(tip), "{args:?}: {stderr}");
    }
}

#[test]
fn a_missing_option_is_named_not_mistaken_for_a_missing_program() {
    for (args, missing) in [
        (
            &["run", "--tls-cert", "c.pem", "n", "true"][..],
            "missing --tls-key <FILE>",
        ),
        (
            &["run", "--tls-key", "k.pem", "n", "true"],
            "missing --tls-cert <FILE>",
        ),
        (
            &["status", "--tls-cert", "c.pem", "n"],
            "missing --tls-key <FILE>",
        ),
        (&["release", "--force"], "missing <NAME>"),
    ] {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(line.contains(missing), "{args:?}: {line}");
        assert!(!line.contains("PROGRAM"), "{args:?}: {line}");
    }
    let (_, _, stderr) = finish(leasehold(&["run", "n"]), SOON);
    assert!(
        one_error_line(&stderr).contains("a PROGRAM to run is required"),
        "{stderr}"
    );
}

#[test]
fn a_bare_leasehold_names_every_command() {
    let (code, _, stderr) = finish(leasehold(&[]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
    let line = one_error_line(&stderr);
    for command in [
        "run",
        "status",
        "list",
        "release",
        "demo",
        "bench",
        "completions",
        "man",
    ] {
        assert!(line.contains(command), "{command} missing: {line}");
    }
    assert!(
        !line.contains("demo-buyer") && !line.contains("bench-worker"),
        "{line}"
    );
}

#[test]
fn usage_errors_cut_a_huge_value_to_one_short_line() {
    let huge = "x".repeat(100_000);
    let huge_duration = format!("{}s", "5".repeat(100_000));
    for args in [
        vec!["run", huge.as_str(), "true"],
        vec!["status", &huge],
        vec![&huge],
        vec!["run", "--ttl", &huge, "n", "true"],
        vec!["run", "--ttl", &huge_duration, "n", "true"],
        vec!["run", "--permits", &huge, "n", "true"],
        vec!["run", &huge_duration, "n", "true"],
    ] {
        let (code, _, stderr) = finish(leasehold(&args), SOON);
        assert_eq!(code, Some(2), "{}", &stderr[..stderr.len().min(300)]);
        let line = one_error_line(&stderr);
        assert!(line.len() < 400, "{} bytes: {}", line.len(), &line[..300]);
        if line.contains("xxx") || line.contains("555") {
            assert!(line.contains("bytes)"), "the cut is said: {line}");
        }
    }
}

#[test]
fn help_wraps_to_the_terminal_width() {
    let help = |columns: &str| {
        let mut command = leasehold(&["run", "--help"]);
        command.env("COLUMNS", columns);
        let (code, stdout, _) = finish(command, SOON);
        assert_eq!(code, Some(0));
        stdout
    };
    let narrow = help("60");
    for line in narrow.lines() {
        // A URL form has no place to break: it may stand alone on a longer line.
        let unbreakable = line.split_whitespace().any(|w| w.chars().count() > 40);
        assert!(line.chars().count() <= 60 || unbreakable, "{line:?}");
    }
    assert!(help("200").lines().any(|l| l.chars().count() > 100));
}

#[test]
fn completions_and_the_man_page_cover_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, script, stderr) = finish(leasehold(&["completions", shell]), SOON);
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        for word in ["status", "list", "--nonblock", "--shared"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
        assert!(
            !script.contains("demo-buyer"),
            "{shell}: hidden commands are not offered"
        );
    }
    let dir = TempDir::new("cli-completions");
    let (_, script, _) = finish(leasehold(&["completions", "bash"]), SOON);
    let file = dir.path().join("leasehold.bash");
    std::fs::write(&file, script).unwrap();
    // The script parses in bash and registers the completion.
    let check = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(". {} && complete -p leasehold", file.display()))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let (code, page, stderr) = finish(leasehold(&["man"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(page.contains(".TH leasehold 1"), "{page}");
    for command in [
        "run",
        "status",
        "list",
        "release",
        "demo",
        "bench",
        "completions",
        "man",
    ] {
        assert!(
            page.contains(&format!("leasehold\\-{command}(1)")) || page.contains(command),
            "{command}"
        );
    }
    let (code, page, _) = finish(leasehold(&["man", "run"]), SOON);
    assert_eq!(code, Some(0));
    assert!(
        page.contains(".TH leasehold-run 1") && page.contains("\\-\\-nonblock"),
        "{page}"
    );
    let (code, _, stderr) = finish(leasehold(&["man", "demo-buyer"]), SOON);
    assert_eq!(code, Some(2), "{stderr}");
}
