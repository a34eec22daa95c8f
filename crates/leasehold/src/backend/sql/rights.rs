//! The rights a client needs on its lease tables, checked when it connects (the Redis store's ACL check is the
//! model): a right that is missing is refused with [`Error::NotPermitted`](crate::Error::NotPermitted), naming it and
//! the `GRANT` that gives it, instead of a server error at the first lock.
//!
//! - **What is needed.** A client that locks needs `SELECT, INSERT, UPDATE, DELETE` on the three tables (`UPDATE` on
//!   the entry table for the fenced transaction's `FOR SHARE`; `DELETE` on the lock table is not used today but is part
//!   of the one statement an operator runs) and, on PostgreSQL, `USAGE` on the fence sequence (`nextval`). A client
//!   that only reads ([`Builder::read_only`](crate::Builder::read_only): the command's `status` and `list`) needs
//!   `SELECT` on the three tables. Tables that are missing need the right to create them (PostgreSQL: `CREATE` on the
//!   schema; MySQL: `CREATE` on the database).
//! - **How it is asked.** PostgreSQL: one statement of `has_table_privilege` and `has_sequence_privilege`, which count
//!   roles. MySQL/MariaDB: one batch of statements that change nothing (`DELETE … WHERE FALSE`), so that the server
//!   applies its own rules (global, database and table grants, wildcards, roles); only when it refuses one are they
//!   run one by one, to name every missing right. `information_schema`'s privilege tables would not do: MariaDB 10.11
//!   lists there the user's own grants, not those of its roles.

/// What a client will do with its tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// Only read them (`inspect`, `held_locks`).
    Read,
    /// Lock: every statement.
    Lock,
}

/// The rights a locking client needs on each table, in the order messages name them.
pub(crate) const TABLE_RIGHTS: [&str; 4] = ["SELECT", "INSERT", "UPDATE", "DELETE"];

/// One object the client uses: a table, or PostgreSQL's fence sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Object {
    /// Its name as the client's statements spell it (quoted).
    pub(crate) name: String,
    pub(crate) sequence: bool,
}

/// One right on one object of a list: the privilege and the object's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Right {
    pub(crate) privilege: &'static str,
    pub(crate) object: usize,
}

/// The rights `used` needs on `objects` (tables, then a sequence).
pub(crate) fn needed(used: Use, objects: &[Object]) -> Vec<Right> {
    let mut rights = Vec::new();
    for (object, o) in objects.iter().enumerate() {
        match (o.sequence, used) {
            (true, Use::Read) => {}
            (true, Use::Lock) => rights.push(Right {
                privilege: "USAGE",
                object,
            }),
            (false, Use::Read) => rights.push(Right {
                privilege: "SELECT",
                object,
            }),
            (false, Use::Lock) => rights.extend(
                TABLE_RIGHTS
                    .iter()
                    .map(|&privilege| Right { privilege, object }),
            ),
        }
    }
    rights
}

/// The `GRANT` statements that give `user` the `rights`, one per object: `names` are the objects' names as the
/// statement spells them, qualified (`public."leasehold_session"`, `` `app`.`leasehold_session` ``).
pub(crate) fn grants(rights: &[Right], objects: &[Object], names: &[String], user: &str) -> String {
    let mut statements: Vec<String> = Vec::new();
    for (object, o) in objects.iter().enumerate() {
        let privileges: Vec<&str> = rights
            .iter()
            .filter(|r| r.object == object)
            .map(|r| r.privilege)
            .collect();
        if privileges.is_empty() {
            continue;
        }
        let kind = if o.sequence { "SEQUENCE " } else { "" };
        statements.push(format!(
            "GRANT {} ON {kind}{} TO {user};",
            privileges.join(", "),
            names[object]
        ));
    }
    statements.join(" ")
}

/// The refusal of a client whose `user` lacks `missing` rights on existing `objects` (named `names`, as [`grants`]
/// takes them) of `store`.
pub(crate) fn refusal(
    store: &str,
    user: &str,
    missing: &[Right],
    objects: &[Object],
    names: &[String],
) -> String {
    let lacks: Vec<String> = objects
        .iter()
        .enumerate()
        .filter_map(|(object, o)| {
            let privileges: Vec<&str> = missing
                .iter()
                .filter(|r| r.object == object)
                .map(|r| r.privilege)
                .collect();
            let kind = if o.sequence { "sequence" } else { "table" };
            (!privileges.is_empty())
                .then(|| format!("{} on {kind} {}", privileges.join(", "), names[object]))
        })
        .collect();
    format!(
        "{store} user {user} lacks {}. As the tables' owner or an administrator, run: {} (the README's SQL section \
         lists every right)",
        lacks.join("; "),
        grants(missing, objects, names, user)
    )
}

/// The refusal of a client (`who`: `PostgreSQL user app`) that may not create the lease tables (`tables`: which, and
/// what was found of them) (`why`: which right is missing), with both ways out: an operator creates them and grants
/// what the client needs (`grants`), or the user is given the right (`create`, a `GRANT`).
pub(crate) fn cannot_create(
    who: &str,
    tables: &str,
    why: &str,
    grants: &str,
    create: &str,
) -> String {
    format!(
        "the lease tables {tables} and {who} may not create them ({why}): either an operator creates them (the \
         README's SQL section has the statements) and runs {grants} or the user is given the right to create them: \
         {create}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Vec<Object> {
        let table = |name: &str| Object {
            name: name.to_owned(),
            sequence: false,
        };
        vec![
            table("s"),
            table("l"),
            table("e"),
            Object {
                name: "f".to_owned(),
                sequence: true,
            },
        ]
    }

    #[test]
    fn a_reader_needs_select_on_the_tables_only() {
        let read = needed(Use::Read, &objects());
        assert!(read.iter().all(|r| r.privilege == "SELECT"));
        assert_eq!(read.len(), 3);
        assert_eq!(needed(Use::Lock, &objects()).len(), 13);
    }

    #[test]
    fn a_refusal_names_each_missing_right_and_the_grant_that_gives_it() {
        let objects = objects();
        let names: Vec<String> = ["public.s", "public.l", "public.e", "public.f"]
            .map(str::to_owned)
            .into();
        let missing = [
            Right {
                privilege: "INSERT",
                object: 0,
            },
            Right {
                privilege: "DELETE",
                object: 0,
            },
            Right {
                privilege: "USAGE",
                object: 3,
            },
        ];
        assert_eq!(
            refusal("PostgreSQL", "app", &missing, &objects, &names),
            "PostgreSQL user app lacks INSERT, DELETE on table public.s; USAGE on sequence public.f. As the tables' \
             owner or an administrator, run: GRANT INSERT, DELETE ON public.s TO app; GRANT USAGE ON SEQUENCE \
             public.f TO app; (the README's SQL section lists every right)"
        );
    }
}
