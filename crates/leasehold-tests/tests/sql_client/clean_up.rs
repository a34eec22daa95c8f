//! The rows a crashed client leaves behind go, though nobody asks for its locks again.

use crate::reads::sessions;
use crate::{client, eventually, Db};

pub async fn a_crashed_clients_rows_go_though_nobody_waits_for_its_locks(db: &mut Db) {
    let prefix = db.fresh_prefix();
    let proxy = leasehold_tests::TcpProxy::start(db.addr()).await;
    let crashed = client(&db.url_at(proxy.addr()), &prefix).await;
    let held = crashed.mutex("abandoned").lock().await.unwrap();
    // Its connections go silent, and it ends without a word to the server: as if its process were killed.
    proxy.blackhole();
    drop(held);
    drop(crashed);
    // Another client with a session, on another lock: nobody waits for `abandoned`.
    let other = client(&db.url(), &prefix).await;
    let elsewhere = other.mutex("elsewhere").lock().await.unwrap();
    let entries = format!("SELECT count(*) FROM {prefix}_entry WHERE name = 'abandoned'");
    eventually("the crashed client's session and entry deleted", || async {
        sessions(db, &prefix) == 1 && db.sql(&entries).trim() == "0"
    })
    .await;
    elsewhere.release().await.unwrap();
}
