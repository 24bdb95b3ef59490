//! Scraping the Prometheus exporter over plain TCP, as Prometheus does (the metrics tests).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The body of `GET /metrics` at `addr` (retried while the exporter's listener starts).
pub fn scrape(addr: SocketAddr) -> String {
    let mut last = None;
    for _ in 0..100 {
        match TcpStream::connect(addr) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).unwrap();
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                return text;
            }
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no exporter at {addr}: {last:?}");
}

/// The value of the series `name` whose labels include every one of `labels` (`k="v"`).
pub fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|want| rest.contains(want))).then(|| v.parse().ok())?
    })
}
