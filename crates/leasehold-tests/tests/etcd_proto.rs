//! The etcd gRPC code checked in under `crates/leasehold/src/backend/etcd/rpc/pb/` is what our `.proto` files
//! (`crates/leasehold/proto/`) generate: regenerated here with `protox` (a protobuf compiler in Rust) and
//! `tonic-prost-build`, with no `protoc`, and compared file by file. `LEASEHOLD_BLESS=1` rewrites the checked-in
//! files instead (after a change to a `.proto` file, or to the generator's version).
//!
//! And the permanent guard: no crate of the command's build (normal and build dependencies) compiles `.proto` files.

use std::path::{Path, PathBuf};

/// The generated files, one per protobuf package.
const PACKAGES: [&str; 3] = ["etcdserverpb", "mvccpb", "v3lockpb"];

fn library() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../leasehold")
}

/// Generates the Rust of our `.proto` files into `out`, as the checked-in files were.
fn generate(out: &Path) {
    let proto = library().join("proto");
    let files = [
        "etcdserverpb/rpc.proto",
        "mvccpb/kv.proto",
        "v3lockpb/v3lock.proto",
    ];
    let descriptors = protox::compile(files, [&proto]).unwrap_or_else(|e| panic!("{e:?}"));
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out)
        .compile_fds(descriptors)
        .unwrap();
}

#[test]
fn generated_code_matches_the_proto_files() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("etcd-proto");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    generate(&out);
    let checked_in = library().join("src/backend/etcd/rpc/pb");
    let bless = std::env::var_os("LEASEHOLD_BLESS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for package in PACKAGES {
        let file = format!("{package}.rs");
        let fresh = std::fs::read_to_string(out.join(&file)).unwrap();
        let path = checked_in.join(&file);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(fresh.as_str()) {
            continue;
        }
        if bless {
            std::fs::write(&path, fresh).unwrap();
        } else {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated etcd code differs from crates/leasehold/proto/ in {stale:?}; \
         run `LEASEHOLD_BLESS=1 cargo test -p leasehold-tests --test etcd_proto` to rewrite it, and commit the result"
    );
}

/// The crates that compile `.proto` files at build time, and so need a `protoc` (or, for the last, are one).
const CODEGEN: [&str; 4] = ["prost-build", "tonic-build", "tonic-prost-build", "protoc"];

/// Whether crate `name` is one of [`CODEGEN`] (or a `protoc-…` crate, a vendored or downloaded compiler).
fn is_codegen(name: &str) -> bool {
    CODEGEN.contains(&name) || name.starts_with("protoc-")
}

#[test]
fn the_command_builds_without_a_protobuf_compiler() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .current_dir(library())
        .args([
            "tree",
            "-p",
            "leasehold-cli",
            "--all-features",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && tree.contains("leasehold-cli"),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let codegen: Vec<&str> = tree
        .lines()
        .filter(|line| line.split_whitespace().next().is_some_and(is_codegen))
        .collect();
    assert!(
        codegen.is_empty(),
        "the command's build (normal and build dependencies) compiles .proto files, which needs protoc: {codegen:?}"
    );
}

#[test]
fn codegen_crates_are_told_by_their_whole_name() {
    assert!(is_codegen("prost-build"));
    assert!(is_codegen("protoc-bin-vendored"));
    assert!(!is_codegen("postgres-protocol"));
    assert!(!is_codegen("prost"));
    assert!(!is_codegen("tonic-prost"));
}
