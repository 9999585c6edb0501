//! A `PG*` variable whose value is not UTF-8 was treated as unset: another
//! host, port or database was used without a word. It is an error that
//! names the variable, never its value. (Its own test binary: it sets the
//! process environment.)

use lease_libpq::{env_var, Conninfo, ErrorKind};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

#[test]
fn a_non_utf8_variable_is_an_error_naming_it() {
    let mut bad = b"prodSECRET".to_vec();
    bad.push(0xff);
    std::env::set_var("PGDATABASE", OsString::from_vec(bad));
    std::env::set_var("PGHOST", "127.0.0.1");
    std::env::set_var("USER", "u");
    for result in [
        Conninfo::from_env(),
        Conninfo::parse("host=h"),
        Conninfo::from_process_env(Some("host=h"), "DATABASE_URL"),
    ] {
        let e = result.unwrap_err();
        eprintln!("{e}");
        assert_eq!(
            (e.kind(), e.keyword()),
            (ErrorKind::InvalidValue, Some("PGDATABASE"))
        );
        assert!(
            e.to_string().contains("PGDATABASE is not valid UTF-8"),
            "{e}"
        );
        assert!(!e.to_string().contains("prod"), "{e}");
    }
    // A string that names the keyword does not read the variable.
    assert!(Conninfo::parse("host=h dbname=d").is_ok());
    let e = env_var("PGDATABASE").unwrap_err();
    assert_eq!(e.keyword(), Some("PGDATABASE"));
    std::env::remove_var("PGDATABASE");
    assert_eq!(env_var("PGDATABASE").unwrap(), None);
    assert_eq!(env_var("PGHOST").unwrap().as_deref(), Some("127.0.0.1"));
}
