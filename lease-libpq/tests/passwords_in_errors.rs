//! A password never reaches an error message or the summary that `lease run`
//! logs ("contending for the lease at {summary}"), however the string is
//! (mis)quoted: after a password, errors name a place or a keyword, never the
//! text; a URL whose password needs percent-encoding and is not is refused
//! without quoting it.

use lease_libpq::{Conninfo, ErrorKind};

fn env(name: &str) -> Option<String> {
    (name == "USER").then(|| "u".to_owned())
}

/// The error text of resolving `s`, or the summary when it resolves.
fn text_of(s: &str) -> String {
    match Conninfo::resolve(Some(s), "--database-url", &env) {
        Ok(c) => format!("Ok: {c} / {c:?}"),
        Err(e) => format!("Err: {e} / {e:?}"),
    }
}

/// `s` is refused, and neither the message nor the debug form holds
/// `secret_part`.
fn assert_refused_hidden(s: &str, secret_part: &str) -> String {
    let text = text_of(s);
    eprintln!("{s:?} -> {text}");
    assert!(
        !text.contains(secret_part),
        "password fragment {secret_part:?} of {s:?} leaks: {text}"
    );
    assert!(text.starts_with("Err: "), "{s:?} resolves: {text}");
    text
}

/// `password=correct horse battery staple` (unquoted, spaces): the second
/// word of the password was named in the syntax error.
#[test]
fn kv_unquoted_password_with_spaces_is_not_echoed() {
    let text = assert_refused_hidden(
        "host=h user=u password=correct horse battery staple",
        "horse",
    );
    assert!(text.contains("at character 32"), "{text}");
    assert!(text.contains("quote a password"), "{text}");
}

/// `password='it's-MySecret9'` (an unescaped quote inside the quoted value):
/// the rest of the password was named as a keyword in the syntax error.
#[test]
fn kv_misquoted_password_is_not_echoed() {
    assert_refused_hidden("host=h user=u password='it's-MySecret9'", "MySecret9");
    // The rest reads as an unclosed quote.
    assert_refused_hidden("host=h password='it's x='Secret99", "Secret99");
}

/// After a password, a word with `=` reads as a keyword: an unknown one is
/// named by its place; a known one is named, its bad value is not.
#[test]
fn kv_keywords_after_a_password_are_not_echoed() {
    let e =
        Conninfo::resolve(Some("host=h password=correct horse=staple9"), "X", &env).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownKeyword);
    assert_eq!(e.keyword(), None);
    assert!(!e.to_string().contains("horse"), "{e}");
    let e = Conninfo::resolve(Some("host=h password=a port=x5Secret"), "X", &env).unwrap_err();
    assert_eq!(e.keyword(), Some("port"));
    assert!(!e.to_string().contains("x5Secret"), "{e}");
    // Before the password, as ever: named, with the likely keyword.
    let e = Conninfo::resolve(Some("host=h usr=app password=pw"), "X", &env).unwrap_err();
    assert_eq!(e.keyword(), Some("usr"));
    assert!(e.to_string().contains("did you mean `user`?"), "{e}");
}

/// A URL password with an unencoded `/` (base64 passwords have them): the
/// part before `/` became the "port", echoed in the error.
#[test]
fn url_password_with_slash_is_not_echoed_in_an_error() {
    let text = assert_refused_hidden(
        "postgres://app:Zm9vYmFy/QmF6cXV4@db.example.com/app",
        "Zm9vYmFy",
    );
    assert!(text.contains("must be percent-encoded"), "{text}");
    assert!(!text.contains("QmF6cXV4"), "{text}");
}

/// The same with a numeric start: it resolved, and the rest of the password
/// was the "database", in the summary `lease run` logs at INFO.
#[test]
fn url_password_with_slash_is_not_in_the_summary() {
    let text = assert_refused_hidden(
        "postgres://app:5432/SecretTail99@db.example.com/app",
        "SecretTail99",
    );
    assert!(text.contains("must be percent-encoded"), "{text}");
}

/// A URL password with an unencoded `@`: the rest was the "host", in the
/// summary `lease run` logs at INFO.
#[test]
fn url_password_with_at_sign_is_not_in_the_summary() {
    let text = assert_refused_hidden(
        "postgres://app:p@ssSECRET99@db.example.com/app",
        "ssSECRET99",
    );
    assert!(text.contains("must be percent-encoded"), "{text}");
    // Percent-encoded, it is the password.
    let c = Conninfo::resolve(
        Some("postgres://app:p%40ssSECRET99@db.example.com/app"),
        "X",
        &env,
    )
    .unwrap();
    assert_eq!(c.config().get_password(), Some(&b"p@ssSECRET99"[..]));
    assert!(!c.to_string().contains("SECRET99"), "{c}");
}

/// `?password=abc&defSECRET`: an unencoded `&` in a query-string password;
/// the rest was named as a URL parameter in the error.
#[test]
fn url_query_password_with_ampersand_is_not_echoed() {
    for s in [
        "postgres://u@h/db?password=abc&defSECRET",
        "postgres://u@h/db?password=abc&defSECRET=1",
        // A user-info password with `?` and `@`: the rest is in the query.
        "postgres://u:ab@c?defSECRET@h",
        "postgres://u:ab@c?defSECRET&x@h",
    ] {
        let text = assert_refused_hidden(s, "defSECRET");
        assert!(text.contains("at character"), "{text}");
    }
    // A parameter that follows no password is named, as ever.
    let e = Conninfo::resolve(Some("postgres://h/db?sslmode"), "X", &env).unwrap_err();
    assert_eq!(e.keyword(), Some("sslmode"));
}
