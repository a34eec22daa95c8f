//! Lock names are bytes: names a default collation folds together (case, accents, trailing spaces) are distinct
//! locks.

use crate::{client, Db};

pub async fn names_a_collation_folds_stay_apart(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = client(&url, &prefix).await;
    let b = client(&url, &prefix).await;
    let names = [
        "Lock", "lock", "LOCK", "café", "cafe", "CAFÉ", "ß", "ss", "x", "x ",
    ];
    let mut held = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // Alternating clients: a name folded onto an earlier one would be busy for the other client.
        let client = if i % 2 == 0 { &a } else { &b };
        let guard =
            client.mutex(name).try_lock().await.unwrap_or_else(|e| {
                panic!("{name:?} is another lock than the ones before it: {e}")
            });
        held.push(guard);
    }
    let mut listed: Vec<String> = a
        .held_locks("*")
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.name)
        .collect();
    listed.sort();
    let mut expected: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for guard in held {
        guard.release().await.unwrap();
    }
}
