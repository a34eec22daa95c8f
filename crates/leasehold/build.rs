//! One cfg for "a store with sessions is compiled in" (etcd, ZooKeeper, PostgreSQL, MySQL), instead of repeating the
//! four features at every item the session stores share.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(session_stores)");
    println!("cargo::rustc-check-cfg=cfg(sql_stores)");
    let on = |feature: &str| std::env::var_os(format!("CARGO_FEATURE_{feature}")).is_some();
    if ["ETCD", "ZOOKEEPER", "POSTGRES", "MYSQL"]
        .into_iter()
        .any(on)
    {
        println!("cargo::rustc-cfg=session_stores");
    }
    if on("POSTGRES") || on("MYSQL") {
        println!("cargo::rustc-cfg=sql_stores");
    }
}
