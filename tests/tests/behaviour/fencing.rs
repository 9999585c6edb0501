//! The fencing recipe of docs/fencing.md, run as written against the PostgreSQL on
//! 127.0.0.1:5432: the resource rejects every write carrying a token older than
//! the newest it has seen, whichever leader writes first.

use crate::common::*;
use tokio_postgres::Client;
use tokio_postgres::NoTls;

/// The SQL block after the `fencing-recipe` marker in docs/fencing.md: the table, then
/// the fence statement.
fn recipe() -> (String, String) {
    let readme = include_str!("../../../docs/fencing.md");
    let start = readme
        .find("<!-- fencing-recipe")
        .expect("docs/fencing.md has the recipe");
    let block = &readme[start..];
    let body = block
        .split("```sql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sql block after the marker");
    let (create, fence) = body.split_once(";\n").expect("two statements");
    let fence: String = fence
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    (
        format!("{create};"),
        fence.trim().trim_end_matches(';').to_owned(),
    )
}

async fn client(schema: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(DB, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("SET search_path = {schema}"))
        .await
        .expect("search_path");
    client
}

/// Begins a transaction and runs the fence with `token`: `true` if it passed.
async fn fence(c: &Client, sql: &str, token: i64) -> bool {
    c.batch_execute("BEGIN").await.expect("begin");
    let rows = c.query(sql, &[&"billing", &token]).await.expect("fence");
    !rows.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_rejects_a_stale_leader_in_either_order() {
    let (create, fence_sql) = recipe();
    let schema = format!("fence_{}_{}", std::process::id(), rand_suffix());
    let admin = {
        let (c, connection) = tokio_postgres::connect(DB, NoTls).await.expect("connect");
        tokio::spawn(connection);
        c
    };
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path = {schema}; {create}"
        ))
        .await
        .expect("create the fence table");

    // The new leader (token 11) writes first: the old one (10) is rejected.
    let (old, new) = (client(&schema).await, client(&schema).await);
    assert!(fence(&new, &fence_sql, 11).await);
    new.batch_execute("COMMIT").await.unwrap();
    assert!(
        !fence(&old, &fence_sql, 10).await,
        "a stale token passed the fence"
    );
    old.batch_execute("ROLLBACK").await.unwrap();

    // The old leader is mid-transaction when the new one fences: the new one
    // waits for the row lock, then passes; the old one's later fence fails.
    assert!(
        fence(&old, &fence_sql, 11).await,
        "the current token passes"
    );
    let new_fenced = {
        let sql = fence_sql.clone();
        tokio::spawn(async move {
            let c = new;
            let passed = fence(&c, &sql, 12).await;
            c.batch_execute("COMMIT").await.unwrap();
            passed
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!new_fenced.is_finished(), "the row lock orders the writers");
    old.batch_execute("COMMIT").await.unwrap();
    assert!(
        new_fenced.await.unwrap(),
        "the newer token passes after the older commits"
    );
    assert!(
        !fence(&old, &fence_sql, 11).await,
        "the older token is rejected afterwards"
    );
    old.batch_execute("ROLLBACK").await.unwrap();
    // The same token again (a retry by the current leader) passes.
    assert!(fence(&old, &fence_sql, 12).await);
    old.batch_execute("ROLLBACK").await.unwrap();

    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the schema");
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
