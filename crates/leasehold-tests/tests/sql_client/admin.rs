//! A superuser's connection of the test's own, beside the library's, to do what an operator or another client does to
//! the lease tables in the middle of a statement of the library's (lock a table or a row, write a session's expiry),
//! to watch what the server's other connections wait for, and to run the caller's own transactions.

use leasehold::mysql_async::prelude::Queryable;
use leasehold::{mysql_async, tokio_postgres};

use crate::{Db, EVENT};

/// One connection to the server as its superuser.
pub enum Admin {
    Postgres(tokio_postgres::Client),
    MySql(mysql_async::Conn),
}

impl Admin {
    /// A new connection to `db`'s `leasehold` database.
    pub async fn connect(db: &Db) -> Admin {
        let url = db.url();
        match db {
            Db::Postgres(_) => {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                Admin::Postgres(client)
            }
            Db::MySql(_) => Admin::MySql(mysql_async::Conn::from_url(url).await.unwrap()),
        }
    }

    /// Runs `sql` (statements separated by `;`, no rows wanted).
    pub async fn run(&mut self, sql: &str) {
        match self {
            Admin::Postgres(client) => client
                .batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            Admin::MySql(conn) => conn
                .query_drop(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Locks `prefix`'s `table` against every other connection's writes, as a migration or a backup does, until
    /// [`unlock_table`](Self::unlock_table) (this connection may still write it).
    pub async fn lock_table(&mut self, prefix: &str, table: &str) {
        let sql = match self {
            Admin::Postgres(_) => {
                format!("BEGIN; LOCK TABLE \"{prefix}_{table}\" IN EXCLUSIVE MODE")
            }
            Admin::MySql(_) => format!("LOCK TABLES `{prefix}_{table}` WRITE"),
        };
        self.run(&sql).await;
    }

    /// Gives back the lock of [`lock_table`](Self::lock_table).
    pub async fn unlock_table(&mut self) {
        let sql = match self {
            Admin::Postgres(_) => "COMMIT",
            Admin::MySql(_) => "UNLOCK TABLES",
        };
        self.run(sql).await;
    }

    /// The first column of the first row of `sql`, as text (`None`: no row, or SQL `NULL`).
    pub async fn text(&mut self, sql: &str) -> Option<String> {
        match self {
            Admin::Postgres(client) => {
                let messages = client
                    .simple_query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                messages.into_iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                })
            }
            Admin::MySql(conn) => conn
                .query_first::<Option<String>, _>(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .flatten(),
        }
    }

    /// The first column of the first row of `sql`, a number.
    pub async fn number(&mut self, sql: &str) -> i64 {
        let text = self.text(sql).await;
        text.as_deref()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{sql}: {text:?} is not a number"))
    }

    /// Session `id`'s expiry under `prefix`, in microseconds since the epoch on the server's clock (`None`: no row).
    pub async fn expiry(&mut self, prefix: &str, id: &str) -> Option<i64> {
        let sql = match self {
            Admin::Postgres(_) => format!(
                "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM \"{prefix}_session\" WHERE id = '{id}'"
            ),
            Admin::MySql(_) => format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) FROM `{prefix}_session` WHERE id = '{id}'"
            ),
        };
        self.text(&sql).await.map(|t| t.parse().unwrap())
    }

    /// Sets session `id`'s expiry under `prefix` to `offset_micros` microseconds from the server's clock as this
    /// statement runs (negative: in the past), as a renewal would (in an open transaction of this connection's, if
    /// there is one).
    pub async fn set_expiry(&mut self, prefix: &str, id: &str, offset_micros: i64) {
        let sql = match self {
            Admin::Postgres(_) => format!(
                "UPDATE \"{prefix}_session\" SET expires_at = clock_timestamp() + {offset_micros} * interval '1 microsecond' \
                 WHERE id = '{id}'"
            ),
            Admin::MySql(_) => format!(
                "UPDATE `{prefix}_session` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {offset_micros} MICROSECOND \
                 WHERE id = '{id}'"
            ),
        };
        self.run(&sql).await;
    }

    /// How many of the server's other connections are running a statement that contains `text` (`waiting`: and wait
    /// for a lock meanwhile: a table's, a row's or, on MySQL, a metadata lock).
    pub async fn running(&mut self, text: &str, waiting: bool) -> i64 {
        let sql = match self {
            Admin::Postgres(_) => format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' \
                 AND strpos(query, $${text}$$) > 0 {}",
                if waiting { "AND wait_event_type = 'Lock'" } else { "" }
            ),
            Admin::MySql(_) => format!(
                "SELECT count(*) FROM information_schema.PROCESSLIST p WHERE p.ID <> CONNECTION_ID() \
                 AND LOCATE('{}', p.INFO) > 0 {}",
                text.replace('\\', "\\\\").replace('\'', "''"),
                if waiting {
                    "AND (p.STATE LIKE 'Waiting for%lock%' OR EXISTS (SELECT 1 FROM \
                     information_schema.INNODB_TRX t WHERE t.trx_mysql_thread_id = p.ID AND t.trx_state = 'LOCK WAIT'))"
                } else {
                    ""
                }
            ),
        };
        self.number(&sql).await
    }

    /// What the server's connections run and wait for, one a line, for a failure's message.
    pub async fn activity(&mut self) -> String {
        let sql = match self {
            Admin::Postgres(_) => "SELECT string_agg(concat_ws(' | ', pid, state, wait_event_type, wait_event, query), \
                                   E'\\n') FROM pg_stat_activity WHERE pid <> pg_backend_pid()",
            Admin::MySql(_) => "SELECT GROUP_CONCAT(CONCAT_WS(' | ', p.ID, p.COMMAND, p.STATE, p.INFO, \
                                (SELECT GROUP_CONCAT(t.trx_state) FROM information_schema.INNODB_TRX t \
                                WHERE t.trx_mysql_thread_id = p.ID)) SEPARATOR '\\n') \
                                FROM information_schema.PROCESSLIST p WHERE p.ID <> CONNECTION_ID()",
        };
        self.text(sql).await.unwrap_or_default()
    }

    /// Waits until [`running`](Self::running) counts `text` as `enough` says, for at most [`EVENT`]; panics naming
    /// `what` otherwise.
    pub async fn until_running(
        &mut self,
        text: &str,
        waiting: bool,
        enough: fn(i64) -> bool,
        what: &str,
    ) {
        let deadline = tokio::time::Instant::now() + EVENT;
        while !enough(self.running(text, waiting).await) {
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "not within {EVENT:?}: {what}; the server runs:\n{}",
                    self.activity().await
                );
            }
            tokio::time::sleep(self.poll()).await;
        }
    }

    /// How long to wait between two looks at what the server runs: 5 ms, but 150 ms on MySQL, whose
    /// `information_schema.INNODB_TRX` (where a row-lock wait shows) is refreshed only when it was not read for 100 ms.
    pub fn poll(&self) -> std::time::Duration {
        std::time::Duration::from_millis(match self {
            Admin::Postgres(_) => 5,
            Admin::MySql(_) => 150,
        })
    }
}

/// The start of statements on `table` (`session`, `entry`) under `prefix`, quoted for `db`: `UPDATE "p_session"`.
pub fn on_table(db: &Db, verb: &str, prefix: &str, table: &str) -> String {
    match db {
        Db::Postgres(_) => format!("{verb} \"{prefix}_{table}\""),
        Db::MySql(_) => format!("{verb} `{prefix}_{table}`"),
    }
}
