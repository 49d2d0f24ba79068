use super::host_port;

#[test]
fn reads_host_and_port_from_service_urls() {
    let hp = |url| host_port(url, 1).unwrap();
    assert_eq!(hp("redis://127.0.0.1:6379/"), ("127.0.0.1".into(), 6379));
    assert_eq!(
        hp("redis://:secret@cache.example:7000/2"),
        ("cache.example".into(), 7000)
    );
    assert_eq!(
        hp("postgres://postgres@localhost/test"),
        ("127.0.0.1".into(), 1)
    );
    assert_eq!(
        hp("postgresql://u:p@[::1]:5433/db?sslmode=disable"),
        ("::1".into(), 5433)
    );
    assert_eq!(
        hp("host=db.internal port=6543 dbname=test"),
        ("db.internal".into(), 6543)
    );
    assert_eq!(hp("dbname=test"), ("127.0.0.1".into(), 1));
    assert!(host_port("redis://h:notaport", 1).is_err());
}
