//! The HTTP server Prometheus scrapes: GET /metrics (with Kata's `filter_family`), GET
//! /sandboxes. Bounded: at most [`MAX_CONNECTIONS`] connections at once (more are
//! closed), a request's head within 10 s and 64 KiB, a connection at most a minute.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::log::{debug, error};
use crate::monitor::Monitor;

pub const MAX_CONNECTIONS: usize = 32;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

const INDEX: &str = "kata-monitor\n\n/metrics    the metrics of every sandbox of this node (?filter_family=PREFIX[,PREFIX])\n/sandboxes  the ids of the sandboxes, one a line\n";

/// The prefixes of `filter_family=a,b` in a query string.
fn filter_family(query: Option<&str>) -> Vec<String> {
    let Some(query) = query else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("filter_family="))
        .flat_map(|v| {
            v.replace("%2C", ",")
                .replace("%2c", ",")
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

async fn handle(
    monitor: Arc<Monitor>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            format!("{} is not served: use GET\n", request.method()),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Ok(r);
    }
    let uri = request.uri();
    debug!("{} {}", request.method(), uri);
    let response = match uri.path() {
        "/metrics" => {
            let prefixes = filter_family(uri.query());
            let body = monitor.scrape(&prefixes).await;
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        "/sandboxes" => {
            let mut body = monitor.sandboxes().join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            text(StatusCode::OK, PLAIN, body)
        }
        "/" => text(StatusCode::OK, PLAIN, INDEX.to_string()),
        other => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            format!("{other} is not served: kata-monitor serves /metrics and /sandboxes\n"),
        ),
    };
    Ok(response)
}

/// Serves `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, monitor: Arc<Monitor>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and the like: wait for connections to end rather than spin.
                error!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("{peer}: closed, {MAX_CONNECTIONS} connections are open already");
            continue;
        };
        let monitor = monitor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |r| handle(monitor.clone(), r));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(64 << 10);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            // A connection past its lifetime is dropped (closed) here.
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                debug!("{peer}: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_family_takes_comma_separated_prefixes() {
        assert_eq!(
            filter_family(Some("filter_family=kata_guest,kata_monitor")),
            vec!["kata_guest", "kata_monitor"]
        );
        assert_eq!(
            filter_family(Some("a=b&filter_family=x%2Cy")),
            vec!["x", "y"]
        );
        assert!(filter_family(None).is_empty());
    }
}
