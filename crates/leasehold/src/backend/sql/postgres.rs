//! PostgreSQL (feature `postgres`): the statements, through `tokio-postgres`, each one round trip (prepared once per
//! connection, in the same turn as its first run), on a small pool of the client's own connections in autocommit; an enqueue and the read of its lock's
//! entries are pipelined into one round trip; and one more connection that only `LISTEN`s.
//!
//! - **Time** is the server's `now()`, the start of the statement's transaction: every statement here is its own
//!   transaction.
//! - **Wake-ups.** Every statement that deletes entries also `NOTIFY`s the prefix's channel with the lock's name, in
//!   the same transaction (delivered at commit); a release only when an entry may be behind it (see `release`). The
//!   listening connection wakes this client's waiters of that name; when it reconnects it wakes them all, since a
//!   notification may have been missed meanwhile.
//! - **Server-side deadlines.** Every connection runs with `statement_timeout` and `lock_timeout` at the per-call
//!   deadline, so that a statement the client gave up on does not go on running (or waiting for a row lock) on the
//!   server.
//! - **Plain index scans.** Every connection runs with `enable_bitmapscan = off`. A released entry stays in the
//!   entry table's index until a vacuum; a plain index scan marks such an entry dead the first time it finds it so,
//!   and later scans skip it, while a bitmap scan (the planner's choice for a lock's few entries) marks nothing and
//!   visits every one released since the last vacuum: a read of one lock's entries cost 138 µs of the server's time
//!   after 3 s of one task locking it, against 25 µs for the whole enqueue (`pg_stat_statements`, 2026-11-29).
//! - **The schema** is created on first use, in one transaction under an advisory lock (two clients creating it at
//!   once would otherwise collide in the catalog); a database whose tables exist needs no DDL right.
//! - **Rights** are checked at connect in one statement of privilege functions ([`check_rights`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Config, NoTls};

use super::rights::{self, Object, Right, Use};
use super::{kind_columns, kind_of_columns, micros, Enqueue, Entry, SqlError, Tables, Wakes};
use crate::backend::admission::Kind;
use crate::backend::session::StoreError;

/// The key of the advisory lock the schema is created under (any fixed number; "leasehold" in ASCII, trimmed).
const SCHEMA_LOCK: i64 = 0x6c65_6173_6568_6f6c;

/// The most idle connections the pool keeps.
const MAX_IDLE: usize = 16;

/// The statements of one prefix.
struct Statements {
    open: String,
    renew: String,
    close: String,
    enqueue: String,
    enqueued: String,
    entries: String,
    reap: String,
    reap_expired: String,
    release: String,
    rewrite: String,
    begin_term: String,
    terms: String,
    delete_entries: String,
    force_release: String,
    names: String,
    commit_check: String,
}

impl Statements {
    fn new(t: &Tables) -> Statements {
        let (session, lock, entry, fence, channel) =
            (&t.session, &t.lock, &t.entry, &t.fence, &t.channel);
        // A lock's entries, with their sessions' state, in the columns `entry_of` reads.
        let read = format!(
            "SELECT e.fence, e.kind, e.permits, e.hold, e.session, \
             COALESCE(s.expires_at > now(), false), \
             COALESCE(GREATEST(extract(epoch FROM s.expires_at - now()), 0), 0)::float8 \
             FROM {entry} e LEFT JOIN {session} s ON s.id = e.session \
             WHERE e.name = $1"
        );
        Statements {
            open: format!(
                "INSERT INTO {session} (id, expires_at) VALUES ($1, now() + $2 * interval '1 microsecond')"
            ),
            // Never lowers the expiry: a renewal that started earlier may land after a later one (see `session`).
            renew: format!(
                "WITH r AS (UPDATE {session} \
                 SET expires_at = GREATEST(expires_at, now() + $2 * interval '1 microsecond') \
                 WHERE id = $1 AND expires_at > now() RETURNING id) \
                 SELECT (SELECT count(*) FROM r), ARRAY(SELECT hold FROM {entry} WHERE session = $1)"
            ),
            close: format!(
                "WITH n AS (SELECT DISTINCT name FROM {entry} WHERE session = $1), \
                 d AS (DELETE FROM {session} WHERE id = $1) \
                 SELECT pg_notify('{channel}', name) FROM n"
            ),
            // The fence is the lock's last one plus one at least, under the lock row's lock: the sequence's numbers
            // are not in order across connections (`CACHE` hands each connection a block of its own).
            enqueue: format!(
                "WITH l AS (INSERT INTO {lock} AS l (name, fence) VALUES ($1, nextval('{fence}')) \
                 ON CONFLICT (name) DO UPDATE SET fence = GREATEST(l.fence + 1, EXCLUDED.fence) \
                 RETURNING l.name, l.fence) \
                 INSERT INTO {entry} (name, fence, session, kind, permits, hold) \
                 SELECT name, fence, $2, $3, $4, $5 FROM l RETURNING fence"
            ),
            entries: format!("{read} AND e.fence <= $2 ORDER BY e.fence"),
            // Sent right behind `enqueue`, on the same connection, before its answer: it cannot know the fence yet, so
            // it reads every entry of the lock (one range of the primary key, as `entries`; a subquery finding the
            // fence by the hold would read that range twice) and `enqueue` keeps those up to its own, found by its
            // hold. Its own transaction, begun after the enqueue's committed.
            enqueued: format!("{read} ORDER BY e.fence"),
            reap: format!(
                "WITH d AS (DELETE FROM {session} WHERE id = ANY($1) AND expires_at <= now() RETURNING id) \
                 SELECT pg_notify('{channel}', $2) FROM (SELECT 1 FROM d LIMIT 1) x"
            ),
            // The subquery picks the candidates in the statement's snapshot; the delete's own condition is evaluated
            // again on the newest version of each row (a renewal that committed meanwhile makes it false).
            reap_expired: format!(
                "WITH d AS (DELETE FROM {session} WHERE id IN (SELECT id FROM {session} \
                 WHERE expires_at < now() - $1 * interval '1 microsecond' LIMIT $2) \
                 AND expires_at < now() - $1 * interval '1 microsecond' RETURNING id) \
                 SELECT pg_notify('{channel}', n.name) FROM (SELECT DISTINCT e.name FROM {entry} e JOIN d \
                 ON e.session = d.id) n"
            ),
            // A row per entry deleted; notifies only when an entry may be behind this one (the lock's newest fence is
            // larger): a release admits none ahead of it. That fence is read with a row lock (at READ COMMITTED a
            // locking read waits for a concurrent writer of the row, then returns its newest version), not from the
            // statement's snapshot, since an enqueue takes the same row with a conflicting lock (`ON CONFLICT DO
            // UPDATE`): either it committed before this read, whose larger fence is seen (and notified), or it waits
            // until this statement committed, and its check, a statement after its own commit, finds this entry
            // gone. From the snapshot, an enqueue that committed after it, and checked before this commit, would
            // sleep until this entry's expiry. The read is evaluated once the delete returned its row, and not at
            // all when there was none.
            release: format!(
                "WITH d AS (DELETE FROM {entry} WHERE name = $1 AND fence = $2 AND session = $3 RETURNING name), \
                 l AS (SELECT fence FROM {lock} WHERE name = $1 FOR SHARE) \
                 SELECT CASE WHEN (SELECT fence FROM l) > $2 THEN pg_notify('{channel}', name)::text END FROM d"
            ),
            rewrite: format!(
                "UPDATE {entry} SET hold = $4 WHERE name = $1 AND fence = $2 AND session = $3 RETURNING fence"
            ),
            // The entry is locked first, and the count row is made or raised only when the entry is there; the
            // entry's update reads the count the upsert returned (PostgreSQL runs a data-modifying WITH whether or
            // not the statement reads it, so `u` returns nothing).
            begin_term: format!(
                "WITH e AS (SELECT 1 FROM {entry} WHERE name = $1 AND fence = $2 AND session = $3 FOR UPDATE), \
                 t AS (INSERT INTO {lock} AS l (name, fence) SELECT $4, 1 FROM e \
                 ON CONFLICT (name) DO UPDATE SET fence = l.fence + 1 RETURNING l.fence), \
                 u AS (UPDATE {entry} SET hold = $5 || (SELECT fence FROM t)::text \
                 WHERE name = $1 AND fence = $2 AND session = $3 AND EXISTS (SELECT 1 FROM t)) \
                 SELECT fence FROM t"
            ),
            terms: format!("SELECT fence FROM {lock} WHERE name = $1"),
            delete_entries: format!(
                "WITH d AS (DELETE FROM {entry} WHERE session = $1 AND hold = ANY($2) RETURNING name) \
                 SELECT pg_notify('{channel}', name) FROM (SELECT DISTINCT name FROM d) x"
            ),
            force_release: format!(
                "WITH d AS (DELETE FROM {entry} WHERE name = $1 RETURNING fence, hold, session) \
                 SELECT (SELECT d.hold FROM d JOIN {session} s ON s.id = d.session AND s.expires_at > now() \
                 ORDER BY d.fence LIMIT 1), pg_notify('{channel}', $1)::text"
            ),
            names: format!(
                "SELECT DISTINCT e.name FROM {entry} e JOIN {session} s ON s.id = e.session \
                 WHERE s.expires_at > now()"
            ),
            commit_check: format!(
                "SELECT 1 FROM {entry} e JOIN {session} s ON s.id = e.session \
                 WHERE e.name = $1 AND e.fence = $2 AND e.session = $3 AND s.expires_at > clock_timestamp() \
                 FOR SHARE OF e"
            ),
        }
    }
}

/// The statements that create the tables, sequence and index of a prefix (`index`: the index's name), as DESIGN.md
/// and the README show them to an operator (a unit test compares them).
fn create_statements(t: &Tables, index: &str) -> [String; 5] {
    let (session, lock, entry, fence) = (&t.session, &t.lock, &t.entry, &t.fence);
    [
        format!("CREATE SEQUENCE IF NOT EXISTS {fence}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {session} (id text PRIMARY KEY, expires_at timestamptz NOT NULL)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {lock} (name text COLLATE \"C\" PRIMARY KEY, fence bigint NOT NULL)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {entry} (name text COLLATE \"C\" NOT NULL, fence bigint NOT NULL, \
             session text NOT NULL REFERENCES {session} (id) ON DELETE CASCADE, kind text NOT NULL, \
             permits integer NOT NULL, hold text NOT NULL, PRIMARY KEY (name, fence))"
        ),
        format!("CREATE INDEX IF NOT EXISTS {index} ON {entry} (session)"),
    ]
}

/// The tables, sequence and index of a prefix, created when missing: in one transaction, under an advisory lock.
fn schema_ddl(t: &Tables, index: &str) -> String {
    format!(
        "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {}; COMMIT;",
        create_statements(t, index).join("; ")
    )
}

/// The objects of a prefix the client uses, as the rights check names them: the three tables, then the sequence.
fn objects(t: &Tables) -> Vec<Object> {
    let table = |name: &String| Object {
        name: name.clone(),
        sequence: false,
    };
    vec![
        table(&t.session),
        table(&t.lock),
        table(&t.entry),
        Object {
            name: t.fence.clone(),
            sequence: true,
        },
    ]
}

/// The columns [`rights_query`] returns before the objects' names.
const RIGHTS_HEAD: usize = 4;

/// One statement that answers everything the rights check asks: the user and the schema new tables go to (both
/// quoted, the schema `NULL` when the user may use none of its search path), whether the user may create tables there,
/// the search path, each object's schema-qualified name (`NULL` when it does not exist, or is in a schema the user
/// may not use), and whether the user has each right (`NULL` when its object is missing). `nextval` takes `USAGE` or
/// `UPDATE` on the sequence; roles count, as they do for the statements.
fn rights_query(objects: &[Object], rights: &[Right]) -> String {
    let mut columns = vec![
        "quote_ident(current_user)".to_owned(),
        "quote_ident(current_schema())".to_owned(),
        "COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false)".to_owned(),
        "current_setting('search_path')".to_owned(),
    ];
    for o in objects {
        columns.push(format!(
            "(SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{}'))",
            o.name
        ));
    }
    for r in rights {
        let o = &objects[r.object];
        let (function, privilege) = if o.sequence {
            ("has_sequence_privilege", "USAGE, UPDATE")
        } else {
            ("has_table_privilege", r.privilege)
        };
        columns.push(format!(
            "{function}(to_regclass('{}'), '{privilege}')",
            o.name
        ));
    }
    format!("SELECT {}", columns.join(", "))
}

/// Checks, in one statement, that the user has every right `used` needs on `prefix`'s tables and sequence; creates
/// them first when they are missing and the user may (then checks again: a table may have been there already, another
/// user's). Refuses with [`SqlError::NotPermitted`] naming every missing right and the `GRANT`s that give them, or,
/// when the tables are missing and the user may not create them (PostgreSQL 15 grants `CREATE` on `public` to the
/// database's owner only), saying so with both ways out.
async fn check_rights(
    conn: &tokio_postgres::Client,
    tables: &Tables,
    prefix: &str,
    used: Use,
) -> Result<(), SqlError> {
    let objects = objects(tables);
    let rights = rights::needed(used, &objects);
    let sql = rights_query(&objects, &rights);
    for created in [false, true] {
        let rows = conn
            .query_typed(&sql, &[])
            .await
            .map_err(pg("check rights"))?;
        let row = rows.first().ok_or(SqlError::Unexpected {
            store: "PostgreSQL",
            what: "no row from the rights check".to_owned(),
        })?;
        let get = |e| pg("check rights")(e);
        let user: String = row.try_get(0).map_err(get)?;
        let schema: Option<String> = row.try_get(1).map_err(get)?;
        let may_create: bool = row.try_get(2).map_err(get)?;
        let path: String = row.try_get(3).map_err(get)?;
        let names = (0..objects.len())
            .map(|i| row.try_get::<_, Option<String>>(RIGHTS_HEAD + i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(get)?;
        let has = (0..rights.len())
            .map(|i| row.try_get::<_, Option<bool>>(RIGHTS_HEAD + objects.len() + i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(get)?;
        if names.iter().any(Option::is_none) {
            let Some(schema) = schema else {
                return Err(SqlError::NotPermitted {
                    detail: format!(
                        "PostgreSQL user {user} may use no schema of its search_path ({path}), so it can neither \
                         find nor create the lease tables of prefix {prefix:?}: run GRANT USAGE ON SCHEMA name TO \
                         {user}; for the schema that holds them (the README's SQL section lists every right)"
                    ),
                });
            };
            if created || !may_create {
                let absent: Vec<String> = objects
                    .iter()
                    .zip(&names)
                    .filter(|(_, name)| name.is_none())
                    .map(|(o, _)| o.name.clone())
                    .collect();
                let qualified: Vec<String> = objects
                    .iter()
                    .map(|o| format!("{schema}.{}", o.name))
                    .collect();
                return Err(SqlError::NotPermitted {
                    detail: rights::cannot_create(
                        &format!("PostgreSQL user {user}"),
                        &format!("of prefix {prefix:?} ({}) do not exist", absent.join(", ")),
                        &format!(
                            "no CREATE on schema {schema}; since PostgreSQL 15 only the database's owner has it on \
                             public"
                        ),
                        &rights::grants(&rights, &objects, &qualified, &user),
                        &format!("GRANT CREATE ON SCHEMA {schema} TO {user};"),
                    ),
                });
            }
            let index = format!("\"{prefix}_entry_session\"");
            conn.batch_execute(&schema_ddl(tables, &index))
                .await
                .map_err(pg("create schema"))?;
            continue;
        }
        let names: Vec<String> = names.into_iter().flatten().collect();
        let missing: Vec<Right> = rights
            .iter()
            .zip(&has)
            .filter(|(_, has)| **has != Some(true))
            .map(|(right, _)| *right)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        return Err(SqlError::NotPermitted {
            detail: rights::refusal("PostgreSQL", &user, &missing, &objects, &names),
        });
    }
    Ok(())
}

/// A PostgreSQL database: its connection settings, the pool, the statements of the client's prefix, and the
/// listener.
pub(crate) struct PgDb {
    pool: Pool,
    statements: Statements,
    tables: Tables,
    prefix: String,
    wakes: Arc<Wakes>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for PgDb {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgDb {
    /// Connects to the database of `url` (`postgres://` or `postgresql://`), creates `prefix`'s tables when missing,
    /// checks that the user has the rights `used` needs on them ([`check_rights`]), and starts listening for
    /// wake-ups.
    pub(crate) async fn connect(
        url: &str,
        prefix: &str,
        connection_timeout: Duration,
        call_timeout: Duration,
        tls: &super::TlsMaterial,
        used: Use,
    ) -> Result<PgDb, SqlError> {
        let mut config: Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| SqlError::InvalidUrl {
                    store: "PostgreSQL",
                    why: e.to_string(),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(connection_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        let ms = call_timeout.as_millis().max(1);
        let options =
            format!("-c statement_timeout={ms} -c lock_timeout={ms} -c enable_bitmapscan=off");
        let options = match config.get_options() {
            Some(given) => format!("{given} {options}"),
            None => options,
        };
        config.options(options);
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(5));
        let connector = Connector::for_url(&config, tls)?;
        let tables = Tables::new(prefix, '"');
        let pool = Pool {
            config,
            connector,
            idle: std::sync::Mutex::new(Vec::new()),
        };
        {
            let conn = pool.get().await?;
            check_rights(&conn, &tables, prefix, used).await?;
            conn.done();
        }
        let wakes = Arc::new(Wakes::default());
        let listener = tokio::spawn(listen(
            pool.config.clone(),
            pool.connector.clone(),
            tables.channel.clone(),
            Arc::clone(&wakes),
            call_timeout,
        ));
        Ok(PgDb {
            pool,
            statements: Statements::new(&tables),
            tables,
            prefix: prefix.to_owned(),
            wakes,
            listener,
        })
    }

    /// Checks that the user has the rights `used` needs on the tables ([`check_rights`]).
    pub(crate) async fn check_rights(&self, used: Use) -> Result<(), SqlError> {
        let conn = self.pool.get().await?;
        check_rights(&conn, &self.tables, &self.prefix, used).await?;
        conn.done();
        Ok(())
    }

    pub(crate) fn wakes(&self) -> &Wakes {
        &self.wakes
    }

    /// The statement a fenced transaction runs before its commit (parameters: name, fence, session).
    pub(crate) fn commit_check(&self) -> &str {
        &self.statements.commit_check
    }

    async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<tokio_postgres::Row>, SqlError> {
        let mut conn = self.pool.get().await?;
        let rows = conn.run(&Call { op, sql, params }).await;
        conn.finish(&[rows.as_ref().err()]);
        rows.map_err(pg(op))
    }

    /// Runs `first` and `second` pipelined on one connection ([`Pooled::run_both`]): the rows of `first`, or its error
    /// (whatever `second` did); and what `second` did.
    async fn query_both(
        &self,
        first: &Call<'_>,
        second: &Call<'_>,
    ) -> Result<(Rows, Answer), SqlError> {
        let mut conn = self.pool.get().await?;
        let (a, b) = conn.run_both(first, second).await;
        conn.finish(&[a.as_ref().err(), b.as_ref().err()]);
        Ok((a.map_err(pg(first.op))?, b))
    }

    pub(crate) async fn open_session(&self, id: &str, ttl: Duration) -> Result<(), SqlError> {
        let ttl = micros(ttl);
        self.query(
            "open session",
            &self.statements.open,
            &[(&id, Type::TEXT), (&ttl, Type::INT8)],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn renew(
        &self,
        id: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<String>>, SqlError> {
        let ttl = micros(ttl);
        let rows = self
            .query(
                "renew",
                &self.statements.renew,
                &[(&id, Type::TEXT), (&ttl, Type::INT8)],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let renewed: i64 = row.try_get(0).map_err(pg("renew"))?;
        if renewed == 0 {
            return Ok(None);
        }
        Ok(Some(row.try_get(1).map_err(pg("renew"))?))
    }

    pub(crate) async fn close_session(&self, id: &str) -> Result<(), SqlError> {
        self.query(
            "close session",
            &self.statements.close,
            &[(&id, Type::TEXT)],
        )
        .await
        .map(drop)
    }

    /// Inserts the entry and, pipelined behind it on the same connection, reads the lock's entries up to it: one
    /// round trip. The read is its own transaction, begun after the insert's committed, as [`Enqueue`] asks; when it
    /// alone fails, the engine's check reads them again.
    pub(crate) async fn enqueue(
        &self,
        name: &str,
        session: &str,
        kind: Kind,
        hold: &str,
    ) -> Result<Enqueue, SqlError> {
        let (tag, permits) = kind_columns(kind);
        let (rows, read) = self
            .query_both(
                &Call {
                    op: "enqueue",
                    sql: &self.statements.enqueue,
                    params: &[
                        (&name, Type::TEXT),
                        (&session, Type::TEXT),
                        (&tag, Type::TEXT),
                        (&permits, Type::INT4),
                        (&hold, Type::TEXT),
                    ],
                },
                &Call {
                    op: "read enqueued",
                    sql: &self.statements.enqueued,
                    params: &[(&name, Type::TEXT)],
                },
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| SqlError::lost_while_waiting(name.to_owned()))?;
        let entries = match read
            .and_then(|rows| rows.iter().map(entry_of).collect::<Result<Vec<_>, _>>())
        {
            Ok(mut entries) => {
                // Up to its own (none when it is gone): the entries behind it do not matter to it.
                let mine = entries
                    .iter()
                    .position(|e| e.hold == hold && e.session == session);
                entries.truncate(mine.map_or(0, |i| i + 1));
                Some(entries)
            }
            Err(e) => {
                tracing::debug!(target: "leasehold::sql", error = %e, "the read behind an enqueue failed");
                None
            }
        };
        Ok(Enqueue {
            fence: row.try_get(0).map_err(pg("enqueue"))?,
            entries,
        })
    }

    pub(crate) async fn entries(
        &self,
        name: &str,
        upto: Option<i64>,
    ) -> Result<Vec<Entry>, SqlError> {
        let upto = upto.unwrap_or(i64::MAX);
        let rows = self
            .query(
                "check",
                &self.statements.entries,
                &[(&name, Type::TEXT), (&upto, Type::INT8)],
            )
            .await?;
        rows.iter()
            .map(entry_of)
            .collect::<Result<_, _>>()
            .map_err(pg("check"))
    }

    pub(crate) async fn reap(&self, name: &str, ids: &[String]) -> Result<(), SqlError> {
        self.query(
            "reap",
            &self.statements.reap,
            &[(&ids, Type::TEXT_ARRAY), (&name, Type::TEXT)],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn reap_expired(&self, grace: Duration, limit: u32) -> Result<(), SqlError> {
        let grace = micros(grace);
        let limit = i64::from(limit);
        self.query(
            "reap expired",
            &self.statements.reap_expired,
            &[(&grace, Type::INT8), (&limit, Type::INT8)],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn release(
        &self,
        name: &str,
        fence: i64,
        session: &str,
    ) -> Result<bool, SqlError> {
        let rows = self
            .query(
                "release",
                &self.statements.release,
                &[
                    (&name, Type::TEXT),
                    (&fence, Type::INT8),
                    (&session, Type::TEXT),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn rewrite(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        hold: &str,
    ) -> Result<bool, SqlError> {
        let rows = self
            .query(
                "proclaim",
                &self.statements.rewrite,
                &[
                    (&name, Type::TEXT),
                    (&fence, Type::INT8),
                    (&session, Type::TEXT),
                    (&hold, Type::TEXT),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn begin_term(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, SqlError> {
        let rows = self
            .query(
                "count a term",
                &self.statements.begin_term,
                &[
                    (&name, Type::TEXT),
                    (&fence, Type::INT8),
                    (&session, Type::TEXT),
                    (&record, Type::TEXT),
                    (&hold, Type::TEXT),
                ],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.try_get::<_, i64>(0).ok())
            .and_then(|term| u64::try_from(term).ok()))
    }

    pub(crate) async fn terms(&self, record: &str) -> Result<u64, SqlError> {
        let rows = self
            .query(
                "read a term count",
                &self.statements.terms,
                &[(&record, Type::TEXT)],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.try_get::<_, i64>(0).ok())
            .and_then(|term| u64::try_from(term).ok())
            .unwrap_or(0))
    }

    pub(crate) async fn delete_entries(
        &self,
        session: &str,
        holds: &[String],
    ) -> Result<(), SqlError> {
        self.query(
            "delete entries",
            &self.statements.delete_entries,
            &[(&session, Type::TEXT), (&holds, Type::TEXT_ARRAY)],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, SqlError> {
        let rows = self
            .query(
                "force release",
                &self.statements.force_release,
                &[(&name, Type::TEXT)],
            )
            .await?;
        match rows.first() {
            Some(row) => row.try_get(0).map_err(pg("force release")),
            None => Ok(None),
        }
    }

    pub(crate) async fn names(&self) -> Result<Vec<String>, SqlError> {
        let rows = self.query("list", &self.statements.names, &[]).await?;
        rows.iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(pg("list"))
    }
}

/// An entry as the statements `entries` and `enqueued` return it.
fn entry_of(row: &tokio_postgres::Row) -> Result<Entry, tokio_postgres::Error> {
    let kind: &str = row.try_get(1)?;
    let permits: i32 = row.try_get(2)?;
    let left: f64 = row.try_get(6)?;
    Ok(Entry {
        fence: row.try_get(0)?,
        kind: kind_of_columns(kind, i64::from(permits)),
        hold: row.try_get(3)?,
        session: row.try_get(4)?,
        live: row.try_get(5)?,
        left: Duration::try_from_secs_f64(left).unwrap_or_default(),
    })
}

/// The error of statement `op`.
fn pg(op: &'static str) -> impl Fn(tokio_postgres::Error) -> SqlError {
    move |source| SqlError::Postgres { op, source }
}

/// Whether a PostgreSQL error passes: the connection failed, or the server cannot answer now (a restart, a
/// terminated backend, a timeout, a deadlock or a lock it could not take in time, too many connections).
pub(crate) fn is_transient(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection failed or closed.
        return true;
    };
    let class = &code.code()[..2];
    matches!(class, "08" | "40" | "53" | "57" | "58")
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || *code == SqlState::FOREIGN_KEY_VIOLATION
}

/// A few connections of the client's own, each used by one statement at a time (a statement may wait for a row
/// lock, and would hold up everything pipelined behind it on a shared connection).
struct Pool {
    config: Config,
    connector: Connector,
    idle: std::sync::Mutex<Vec<Conn>>,
}

/// One connection, and the statements prepared on it (each is parsed and planned once per connection, not per call:
/// most of the server's work for a statement this small).
struct Conn {
    client: tokio_postgres::Client,
    prepared: std::collections::HashMap<&'static str, tokio_postgres::Statement>,
}

impl Pool {
    /// An idle connection, or a new one.
    async fn get(&self) -> Result<Pooled<'_>, SqlError> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match idle {
                Some(conn) if !conn.client.is_closed() => {
                    return Ok(Pooled {
                        pool: self,
                        conn: Some(conn),
                    })
                }
                Some(_) => continue,
                None => break,
            }
        }
        let client = self
            .connector
            .open(&self.config)
            .await
            .map_err(pg("connect"))?;
        Ok(Pooled {
            pool: self,
            conn: Some(Conn {
                client,
                prepared: std::collections::HashMap::new(),
            }),
        })
    }
}

/// The rows a statement returned.
type Rows = Vec<tokio_postgres::Row>;

/// What a statement returned, or why it failed.
type Answer = Result<Rows, tokio_postgres::Error>;

/// One statement to run: its name (the key it is prepared under on each connection), its text, and its parameters
/// with their types.
struct Call<'a> {
    op: &'static str,
    sql: &'a str,
    params: &'a [(&'a (dyn ToSql + Sync), Type)],
}

impl Call<'_> {
    fn values(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(|(v, _)| *v).collect()
    }
}

/// A connection taken from the pool. It goes back only through [`Pooled::finish`], once every statement sent on it was
/// answered: one dropped with a statement still out (a timeout, a dropped future) is closed instead.
struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
}

impl Pooled<'_> {
    fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a pooled connection is present until done")
    }

    /// Runs `call` on this connection: as the statement prepared on it under `call.op`, or, the first time, as text
    /// with its parameters typed, written in the same turn as its preparation for the next time. Either way one round
    /// trip. Returns the statement prepared meanwhile, for [`keep`](Self::keep).
    fn answer<'c>(
        &'c self,
        call: &'c Call<'c>,
    ) -> impl std::future::Future<Output = (Option<tokio_postgres::Statement>, Answer)> + 'c {
        let conn = self
            .conn
            .as_ref()
            .expect("a pooled connection is present until done");
        let cached = conn.prepared.get(call.op).cloned();
        async move {
            let client = &conn.client;
            match cached {
                Some(statement) => (None, client.query(&statement, &call.values()).await),
                None => {
                    let types: Vec<Type> = call.params.iter().map(|(_, t)| t.clone()).collect();
                    let (prepared, rows) = futures_util::future::join(
                        client.prepare_typed(call.sql, &types),
                        client.query_typed(call.sql, call.params),
                    )
                    .await;
                    (prepared.ok(), rows)
                }
            }
        }
    }

    /// Remembers `statement`, prepared for `op` on this connection.
    fn keep(&mut self, op: &'static str, statement: Option<tokio_postgres::Statement>) {
        if let Some(statement) = statement {
            self.conn().prepared.insert(op, statement);
        }
    }

    /// Runs `call`: one round trip ([`answer`](Self::answer)).
    async fn run(&mut self, call: &Call<'_>) -> Answer {
        let (prepared, rows) = self.answer(call).await;
        self.keep(call.op, prepared);
        rows
    }

    /// Runs `first` and `second` pipelined: both are written before either is answered (one round trip, prepared or
    /// not), and the server runs them one after the other, each in its own transaction (each ends with its own
    /// `Sync`), so `second` begins after `first` committed, and runs even when `first` failed.
    async fn run_both(&mut self, first: &Call<'_>, second: &Call<'_>) -> (Answer, Answer) {
        // Polled together, the two are written to the connection in order before either waits for its answer.
        let ((a_prepared, a), (b_prepared, b)) =
            futures_util::future::join(self.answer(first), self.answer(second)).await;
        self.keep(first.op, a_prepared);
        self.keep(second.op, b_prepared);
        (a, b)
    }

    /// Gives the connection back once every statement sent on it was answered (`errors`: each one's, if it failed):
    /// each succeeded, or the server refused it (an error with a SQLSTATE) and the connection is still open. Any other
    /// error may have left a statement unanswered, and drops (closes) it.
    fn finish(self, errors: &[Option<&tokio_postgres::Error>]) {
        if errors.iter().flatten().all(|e| e.code().is_some()) && !self.is_closed() {
            self.done();
        }
    }

    fn done(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < MAX_IDLE && !conn.client.is_closed() {
                idle.push(conn);
            }
        }
    }
}

impl Drop for Pooled<'_> {
    /// A connection dropped before its statement was answered (a timeout, a failed connection, a dropped future) is
    /// closed, and so is every idle one: they went out on the same path, and one that went silent (a path that drops
    /// everything without closing) would otherwise hold up the next statement for a whole call deadline, and the next.
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            let idle =
                std::mem::take(&mut *self.pool.idle.lock().unwrap_or_else(|e| e.into_inner()));
            drop(idle);
        }
    }
}

impl std::ops::Deref for Pooled<'_> {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self
            .conn
            .as_ref()
            .expect("a pooled connection is present until done")
            .client
    }
}

/// How the client's connections are made: in the clear, or (features `tls` and `postgres`, `sslmode=require`) over
/// verified TLS.
#[derive(Clone)]
enum Connector {
    Plain,
    #[cfg(feature = "tls")]
    Tls(super::pg_tls::MakeRustls),
}

impl Connector {
    /// The connector `config`'s `sslmode` asks for: TLS only for `require`, and only with TLS `material` checked.
    fn for_url(config: &Config, material: &super::TlsMaterial) -> Result<Connector, SqlError> {
        let required = config.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
        #[cfg(feature = "tls")]
        {
            if required {
                return super::pg_tls::MakeRustls::new(material)
                    .map(Connector::Tls)
                    .map_err(|e| SqlError::InvalidUrl {
                        store: "PostgreSQL",
                        why: e.to_string(),
                    });
            }
            if !material.is_empty() {
                return Err(SqlError::InvalidUrl {
                    store: "PostgreSQL",
                    why: "TLS certificates were given for a URL without sslmode=require".to_owned(),
                });
            }
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = material;
            if required {
                return Err(SqlError::InvalidUrl {
                    store: "PostgreSQL",
                    why: "sslmode=require needs leasehold's `tls` feature".to_owned(),
                });
            }
        }
        Ok(Connector::Plain)
    }

    /// A new connection, its I/O driven by a task of its own.
    async fn open(&self, config: &Config) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        fn drive<F>(connection: F)
        where
            F: std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
        {
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(target: "leasehold::sql", error = %e, "a PostgreSQL connection ended");
                }
            });
        }
        match self {
            Connector::Plain => {
                let (client, connection) = config.connect(NoTls).await?;
                drive(connection);
                Ok(client)
            }
            #[cfg(feature = "tls")]
            Connector::Tls(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                drive(connection);
                Ok(client)
            }
        }
    }
}

/// The listener: one connection that `LISTEN`s on `channel` and wakes the waiters of each name notified; reconnects
/// with backoff when it fails, and wakes every waiter when it is back.
///
/// Each connection attempt has `ping` (the per-call deadline) to be answered, start-up included: `tokio-postgres`'s
/// connect timeout covers only the socket, and a path that went silent after accepting it (a proxy, a firewall)
/// would leave the listener waiting for the server's first answer for ever, and every waiter of the client deaf to
/// releases until the expiry of what it waits for (the `pg` torture's remaining stalls; tested by `sql_client`'s
/// `a_waiter_whose_listener_reconnected_into_a_partition_still_hears_the_release`).
async fn listen(
    config: Config,
    connector: Connector,
    channel: String,
    wakes: Arc<Wakes>,
    ping: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let listened = match &connector {
            Connector::Plain => listen_with(&config, NoTls, &channel, &wakes, ping).await,
            #[cfg(feature = "tls")]
            Connector::Tls(tls) => listen_with(&config, tls.clone(), &channel, &wakes, ping).await,
        };
        match listened {
            Ok(true) => backoff = Duration::from_millis(50),
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(target: "leasehold::sql", error = %e, "the PostgreSQL listener cannot connect");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Connects through `tls` within `ping`, then listens on that connection until it ends ([`listen_on`]); whether
/// `LISTEN` was answered, or why the connection was not made.
async fn listen_with<T>(
    config: &Config,
    tls: T,
    channel: &str,
    wakes: &Wakes,
    ping: Duration,
) -> Result<bool, String>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = match tokio::time::timeout(ping, config.connect(tls)).await {
        Ok(connected) => connected.map_err(|e| e.to_string())?,
        Err(_) => return Err(format!("not answered within {ping:?}")),
    };
    Ok(listen_on(client, connection, channel, wakes, ping).await)
}

/// Listens on one connection until it ends, or until a ping (every `ping`) goes unanswered for as long: a connection
/// whose path went silent would otherwise look alive until TCP gives up on it, and its waiters would hear of releases
/// only at the expiry of what they wait for. Returns whether `LISTEN` was answered.
async fn listen_on<S, T>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<S, T>,
    channel: &str,
    wakes: &Wakes,
    ping: Duration,
) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pump = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                if tx.send(n.payload().to_owned()).is_err() {
                    return;
                }
            }
        }
    });
    let listen = format!("LISTEN \"{channel}\"");
    let listening = matches!(
        tokio::time::timeout(ping, client.batch_execute(&listen)).await,
        Ok(Ok(()))
    );
    if listening {
        wakes.wake_all();
        let mut tick = tokio::time::interval(ping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                name = rx.recv() => match name {
                    Some(name) => wakes.wake(&name),
                    None => break,
                },
                _ = tick.tick() => {
                    let answered = tokio::time::timeout(ping, client.simple_query("")).await;
                    if !matches!(answered, Ok(Ok(_))) {
                        tracing::debug!(target: "leasehold::sql", "the PostgreSQL listener's connection went silent; reconnecting");
                        break;
                    }
                }
            }
        }
    }
    pump.abort();
    wakes.wake_all();
    listening
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_statements_are_the_ones_the_client_runs() {
        let tables = Tables::new("leasehold", '"');
        let created = create_statements(&tables, "\"leasehold_entry_session\"");
        assert_eq!(
            super::super::documented_sql("PostgreSQL: the tables"),
            created.map(|s| super::super::normalized(&s))
        );
    }
}
