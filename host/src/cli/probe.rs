//! `host probe URL`: asks an HTTP(S) endpoint (the operator's `/readyz`, `/healthz`, or its
//! secure `/metrics` with a token) and says what it answered. The operator's image is FROM
//! scratch, so this is its HTTP client: `helm test` runs it in a pod of that image.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::Error;

/// The most of an answer's body that is printed.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// `host probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// How long to wait for the whole answer.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::units::parse_duration)]
    pub timeout: Duration,
    /// PEM CA certificates to trust for an https URL, besides the system's.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// A file whose contents are sent as the bearer token (a ServiceAccount's token, for the
    /// operator's secure /metrics).
    #[arg(long, value_name = "FILE")]
    pub bearer_token_file: Option<PathBuf>,
    /// What to ask: `http[s]://HOST[:PORT]/PATH`.
    #[arg(value_name = "URL")]
    pub url: String,
}

pub(super) fn run(args: &ProbeArgs) -> Result<ExitCode, Error> {
    let failed = |reason: String| Error::Probe {
        url: args.url.clone(),
        reason,
    };
    let uri: http::Uri = args
        .url
        .parse()
        .map_err(|e| failed(format!("not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(failed("expected http[s]://HOST[:PORT]/PATH".to_owned()));
    }
    let token = match &args.bearer_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|source| Error::Read {
                    path: path.clone(),
                    source,
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let tls = crate::oci::tls_config(args.ca_file.as_deref())?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let mut request = http::Request::get(uri);
    if let Some(token) = &token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Start)?;
    let answer = runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build(connector);
        tokio::time::timeout(args.timeout, async {
            let response = client
                .request(request)
                .await
                .map_err(|e| format!("no answer: {e:?}"))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, String>((status, body))
        })
        .await
        .map_err(|_| format!("no answer within {:?}", args.timeout))?
    });
    let (status, body) = answer.map_err(failed)?;
    let body = String::from_utf8_lossy(&body);
    if status.is_success() {
        super::emit(&format!("{status}\n{body}"))?;
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{}: {status}: {}", args.url, body.trim_end());
        Ok(ExitCode::FAILURE)
    }
}
