//! TLS on both surfaces of `leaseline serve`, with real clients: curl
//! (`--cacert`, `--cert`/`--key`), psql (`sslmode`, `sslrootcert`) and
//! `openssl s_client` to read the certificate served. Certificates come
//! from a private CA made with the openssl command for each test.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        text(&out.stderr)
    );
}

/// A private CA: `NAME.pem` and `NAME.key` in `dir`.
fn ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    dir.join(format!("{name}.pem"))
}

/// A certificate `NAME.pem` with key `NAME.key`, signed by CA `ca`:
/// for the server (`localhost`, 127.0.0.1) or for a client.
fn issue(dir: &Path, ca: &str, name: &str, org: &str, server: bool) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/O={org}/CN={}", if server { "localhost" } else { name }),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    let ext = if server {
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    } else {
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    };
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    let serial = format!("0x{:x}", rand::random::<u64>());
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-set_serial",
            &serial,
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The subject of the certificate served on `port` (`postgres`: after an
/// `SSLRequest`), as `openssl s_client` prints it.
fn served_subject(port: u16, ca: &Path, postgres: bool) -> String {
    served_subject_with(
        port,
        ca,
        if postgres {
            &["-starttls", "postgres"]
        } else {
            &[]
        },
    )
}

/// [`served_subject`] with other `s_client` arguments.
fn served_subject_with(port: u16, ca: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &format!("127.0.0.1:{port}"),
        "-servername",
        "localhost",
        "-CAfile",
        s(ca),
    ]);
    let out = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl");
    text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("subject="))
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|| format!("no certificate: {}", text(&out.stderr)))
}

fn psql(conninfo: &str, sql: &str) -> std::process::Output {
    Command::new("psql")
        .arg(conninfo)
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env_remove("PGSSLMODE")
        .output()
        .expect("psql")
}

fn tls_server(
    dir: &Path,
    lake: &Path,
    ca: &Path,
    cert: &Path,
    key: &Path,
    extra: &[&str],
) -> Server {
    let mut args = vec!["--tls-cert-file", s(cert), "--tls-key-file", s(key)];
    args.extend_from_slice(extra);
    Server::start_with(lake, &args, dir, 200, &["--cacert", s(ca)])
}

fn lake(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    import_files(&lake, &[sample()]);
    lake
}

#[test]
fn both_surfaces_speak_tls_and_refuse_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "ca");
    let (cert, key) = issue(d, "ca", "server", "first", true);
    let lake = lake(d);
    let server = tls_server(d, &lake, &ca, &cert, &key, &["--pg-max-connections", "2"]);
    assert!(
        server.http.starts_with("https://127.0.0.1:"),
        "{}",
        server.http
    );

    // HTTPS with the private CA.
    let health = server.get("/health");
    assert_eq!(health.status, 200, "{}", health.text());
    let q = server.sql("SELECT count(*) AS n FROM lease_events", &[]);
    assert_eq!(q.json()[0]["n"], 78);
    // A client that does not trust the CA stops at the handshake.
    let untrusted = curl(&[&format!("{}/health", server.http)]);
    assert_eq!(untrusted.status, 0);
    // Plain HTTP on the TLS port: one plaintext answer saying so, nothing served.
    let plain_url = server.http.replace("https://", "http://");
    let plain = curl(&[
        &format!("{plain_url}/api/v1/sql"),
        "--data-binary",
        "SELECT 1",
    ]);
    assert_eq!(plain.status, 400, "{}", plain.text());
    assert_eq!(
        plain.json()["message"],
        "this address speaks HTTPS only (serve.tls_cert_file is set): use https://"
    );

    // PostgreSQL: sslmode=require, and verify-full against the CA and the
    // name in the certificate.
    let port = server.pg_port;
    let base =
        format!("host=localhost hostaddr=127.0.0.1 port={port} user=leaseline dbname=leaseline");
    for mode in [
        "sslmode=require".to_string(),
        format!("sslmode=verify-full sslrootcert={}", s(&ca)),
        // prefer asks for TLS first, and gets it.
        "sslmode=prefer".to_string(),
    ] {
        let out = psql(
            &format!("{base} {mode}"),
            "SELECT count(*) FROM lease_events",
        );
        assert!(out.status.success(), "{mode}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "78", "{mode}");
        let info = Command::new("psql")
            .arg(format!("{base} {mode}"))
            .args(["-X", "-c", "\\conninfo"])
            .output()
            .unwrap();
        assert!(
            text(&info.stdout).contains("SSL connection (protocol: TLSv1.3"),
            "{mode}: {}{}",
            text(&info.stdout),
            text(&info.stderr)
        );
    }
    // PostgreSQL 17's direct TLS: a handshake at once, naming the protocol.
    assert_eq!(
        served_subject_with(port, &ca, &["-alpn", "postgresql"]),
        "O = first, CN = localhost"
    );
    // verify-full checks the name.
    let out = psql(
        &format!(
            "host=db.example hostaddr=127.0.0.1 port={port} user=leaseline dbname=leaseline \
             sslmode=verify-full sslrootcert={}",
            s(&ca)
        ),
        "SELECT 1",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not match host name \"db.example\""),
        "{}",
        text(&out.stderr)
    );

    // No downgrade: a plaintext startup gets FATAL 28000 and nothing else.
    let out = psql(&format!("{base} sslmode=disable"), "SELECT 1");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            "FATAL:  this server requires TLS: connect with sslmode=require, verify-ca or verify-full"
        ),
        "{}",
        text(&out.stderr)
    );
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(&startup_message()).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert_eq!(answer[0], b'E', "{answer:?}");
    let answer = text(&answer);
    assert!(answer.contains("SFATAL"), "{answer}");
    assert!(answer.contains("C28000"), "{answer}");
    // Asking for TLS, then speaking plaintext anyway, gets no PostgreSQL
    // message either: the handshake fails.
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .unwrap();
    let mut s_byte = [0u8; 1];
    raw.read_exact(&mut s_byte).unwrap();
    assert_eq!(&s_byte, b"S");
    raw.write_all(&startup_message()).unwrap();
    let mut after = Vec::new();
    let _ = raw.read_to_end(&mut after);
    assert!(
        after.is_empty() || after[0] == 0x15,
        "expected a TLS alert or nothing, got {after:?}"
    );

    // A full server says so over TLS too.
    let mut held: Vec<TcpStream> = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            // One more each time round, until the earlier clients' places
            // are given back and these hold both.
            held.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
            let out = psql(&format!("{base} sslmode=require"), "SELECT 1");
            text(&out.stderr).contains("sorry, too many clients already")
        }),
        "{}",
        server.proc.logs()
    );
    // ...and to a client that opens with the TLS handshake (direct TLS):
    // the handshake, then the reason, over TLS.
    let answer = direct_tls_answer(port, &ca, &startup_message());
    assert!(
        answer.contains("sorry, too many clients already"),
        "{answer}"
    );
    drop(held);
    assert!(!server.proc.logs().contains("PRIVATE KEY"));
}

/// What a server sends back over PostgreSQL 17's direct TLS (a handshake
/// at once, ALPN `postgresql`) to `message`, until it closes.
fn direct_tls_answer(port: u16, ca: &Path, message: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-ign_eof",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "localhost",
            "-alpn",
            "postgresql",
            "-CAfile",
            s(ca),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(message).unwrap();
    let out = child.wait_with_output().unwrap();
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// A protocol 3.0 startup message for user and database `leaseline`.
fn startup_message() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196608u32.to_be_bytes());
    for (k, v) in [("user", "leaseline"), ("database", "leaseline")] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    msg
}

#[test]
fn sighup_reloads_the_certificate_and_a_bad_file_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "ca");
    let (first_cert, first_key) = issue(d, "ca", "first", "first", true);
    let (second_cert, second_key) = issue(d, "ca", "second", "second", true);
    let (cert, key) = (d.join("served.pem"), d.join("served.key"));
    std::fs::copy(&first_cert, &cert).unwrap();
    std::fs::copy(&first_key, &key).unwrap();
    let lake = lake(d);
    let mut server = tls_server(d, &lake, &ca, &cert, &key, &[]);
    let http_port: u16 = server.http.rsplit(':').next().unwrap().parse().unwrap();
    let pg_port = server.pg_port;
    assert_eq!(
        served_subject(http_port, &ca, false),
        "O = first, CN = localhost"
    );
    assert_eq!(
        served_subject(pg_port, &ca, true),
        "O = first, CN = localhost"
    );

    // A connection opened before the reload keeps working after it.
    std::fs::copy(&second_cert, &cert).unwrap();
    std::fs::copy(&second_key, &key).unwrap();
    server.proc.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || served_subject(
            http_port, &ca, false
        )
            == "O = second, CN = localhost"),
        "{}",
        server.proc.logs()
    );
    assert_eq!(
        served_subject(pg_port, &ca, true),
        "O = second, CN = localhost"
    );
    assert!(server.proc.logs().contains("TLS certificate reloaded"));

    // A key that does not belong to the certificate: an error in the log,
    // and the previous certificate goes on being served.
    std::fs::copy(&first_key, &key).unwrap();
    server.proc.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || server.proc.logs().contains(
            "TLS reload failed; still serving the previous certificate"
        )),
        "{}",
        server.proc.logs()
    );
    assert_eq!(
        served_subject(http_port, &ca, false),
        "O = second, CN = localhost"
    );
    assert_eq!(
        served_subject(pg_port, &ca, true),
        "O = second, CN = localhost"
    );
    let health = server.get("/health");
    assert_eq!(health.status, 200, "{}", health.text());
    // An unreadable file too.
    std::fs::write(&cert, "garbage").unwrap();
    server.proc.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || server
            .proc
            .logs()
            .contains("no certificate in it")),
        "{}",
        server.proc.logs()
    );
    assert_eq!(
        served_subject(http_port, &ca, false),
        "O = second, CN = localhost"
    );
    let key_text = std::fs::read_to_string(&key).unwrap();
    let key_body = key_text.lines().nth(1).unwrap();
    assert!(
        !server.proc.logs().contains(key_body),
        "the key leaked into the log"
    );
    assert!(server.proc.running());
    assert!(server.proc.terminate(Duration::from_secs(30)).success());
}

#[test]
fn mutual_tls_refuses_http_clients_without_a_certificate_from_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca_pem = ca(d, "ca");
    let clients_ca = ca(d, "clients");
    let (cert, key) = issue(d, "ca", "server", "first", true);
    let (good_cert, good_key) = issue(d, "clients", "grafana", "ops", false);
    let (stray_cert, stray_key) = issue(d, "ca", "stray", "ops", false);
    let lake = lake(d);
    let server = Server::start_with(
        &lake,
        &[
            "--tls-cert-file",
            s(&cert),
            "--tls-key-file",
            s(&key),
            "--http-client-ca-file",
            s(&clients_ca),
        ],
        d,
        200,
        &[
            "--cacert",
            s(&ca_pem),
            "--cert",
            s(&good_cert),
            "--key",
            s(&good_key),
        ],
    );
    let url = format!("{}/health", server.http);
    let with =
        |c: &Path, k: &Path| curl(&["--cacert", s(&ca_pem), "--cert", s(c), "--key", s(k), &url]);
    let ok = with(&good_cert, &good_key);
    assert_eq!(ok.status, 200, "{}", ok.text());
    // No certificate, or one from another CA: the handshake fails.
    assert_eq!(curl(&["--cacert", s(&ca_pem), &url]).status, 0);
    assert_eq!(with(&stray_cert, &stray_key).status, 0);
    assert!(server.proc.logs().contains("HTTP TLS handshake failed"));
    // PostgreSQL asks for no client certificate.
    let out = psql(
        &format!(
            "host=127.0.0.1 port={} user=leaseline dbname=leaseline sslmode=require",
            server.pg_port
        ),
        "SELECT 1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn incomplete_tls_settings_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "ca");
    let (cert, key) = issue(d, "ca", "server", "first", true);
    let lake = lake(d);
    let start = |args: &[&str]| {
        let out = leaseline()
            .args(["serve", "--http-listen", "127.0.0.1:0", "--no-pg", "--lake"])
            .arg(&lake)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        text(&out.stderr).lines().next().unwrap_or("").to_string()
    };
    assert_eq!(
        start(&["--tls-cert-file", s(&cert)]),
        "error: TLS needs both serve.tls_cert_file and serve.tls_key_file (--tls-cert-file, --tls-key-file)"
    );
    assert_eq!(
        start(&["--http-client-ca-file", s(&ca)]),
        "error: serve.http_client_ca_file needs TLS: set serve.tls_cert_file and serve.tls_key_file too"
    );
    // The key of another certificate.
    let (_, other_key) = issue(d, "ca", "other", "other", true);
    let err = start(&["--tls-cert-file", s(&cert), "--tls-key-file", s(&other_key)]);
    assert!(err.starts_with("error: serve.tls_cert_file "), "{err}");
    let key_text = std::fs::read_to_string(&key).unwrap();
    assert!(!err.contains(key_text.lines().nth(1).unwrap()));
}
