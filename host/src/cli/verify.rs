//! `host verify`: whether a plugin in a registry is signed by what is trusted, as `cosign
//! verify` and `kwctl verify` say it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{Error, RegistryArgs, ReportFormat, emit};
use crate::signature::{self, Authority, Identity, PublicKey, Roots, Trusted};

/// `host verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A public key (PEM, as `cosign generate-key-pair` writes `cosign.pub`) whose signatures
    /// count. Repeat for several.
    #[arg(long = "key", value_name = "FILE")]
    pub keys: Vec<PathBuf>,
    /// Certificate authorities whose certificates count when they name the identity: PEM
    /// certificates, or a Sigstore `trusted_root.json`. Repeat for several.
    #[arg(
        long = "trusted-root",
        value_name = "FILE",
        requires = "certificate_identity"
    )]
    pub trusted_roots: Vec<PathBuf>,
    /// The subject a signing certificate must name (a URI or an email).
    #[arg(
        long,
        value_name = "SUBJECT",
        requires = "certificate_oidc_issuer",
        requires = "trusted_roots"
    )]
    pub certificate_identity: Option<String>,
    /// The OIDC issuer a signing certificate must name.
    #[arg(long, value_name = "URL", requires = "certificate_identity")]
    pub certificate_oidc_issuer: Option<String>,
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// How to report.
    #[arg(short, long, value_enum, default_value_t = ReportFormat::Text)]
    pub output: ReportFormat,
    /// What to verify: `[oci://]REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]` (a tag is resolved
    /// to its digest first).
    #[arg(value_name = "REF")]
    pub reference: String,
}

/// What `-o json` writes.
#[derive(Debug, serde::Serialize)]
struct Report {
    /// The reference, pinned to the digest that was checked.
    reference: String,
    verified: bool,
    /// The signatures that count.
    signatures: Vec<signature::Verified>,
    /// Why none counts, when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What is trusted, read from the files the flags name.
fn trusted(args: &VerifyArgs) -> Result<Trusted, Error> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })
    };
    let mut trusted = Trusted::default();
    for path in &args.keys {
        trusted.keys.push(PublicKey::from_pem(
            &path.display().to_string(),
            &read(path)?,
        )?);
    }
    // The command line trusts every identity it names from every authority it names.
    let identities: Vec<Identity> =
        match (&args.certificate_identity, &args.certificate_oidc_issuer) {
            (Some(subject), Some(issuer)) => vec![Identity {
                subject: subject.clone(),
                issuer: issuer.clone(),
            }],
            _ => Vec::new(),
        };
    for path in &args.trusted_roots {
        trusted.authorities.push(Authority {
            roots: Roots::from_bytes(&path.display().to_string(), &read(path)?)?,
            identities: identities.clone(),
        });
    }
    if trusted.is_empty() {
        return Err(Error::NothingTrusted);
    }
    Ok(trusted)
}

pub(super) fn run(args: &VerifyArgs) -> Result<ExitCode, Error> {
    let trusted = trusted(args)?;
    let reference = crate::oci::Reference::parse(&args.reference)?;
    let options = args.registries.options()?;
    let resolved = super::runtime(None)?.block_on(async {
        let pinned = crate::oci::resolve(&reference, &options).await?;
        let result = signature::verify(&pinned, &options, &trusted).await;
        Ok::<_, Error>((pinned, result))
    });
    let (pinned, result) = match resolved {
        Ok(done) => done,
        Err(e) if args.output == ReportFormat::Json => return json_failure(&reference, e),
        Err(e) => return Err(e),
    };
    let failed = match &result {
        Ok(_) => None,
        Err(signature::Error::Unsigned { .. } | signature::Error::Untrusted { .. }) => {
            result.as_ref().err().map(ToString::to_string)
        }
        Err(_) => None,
    };
    let signatures = match result {
        Ok(verified) => verified,
        Err(e @ (signature::Error::Unsigned { .. } | signature::Error::Untrusted { .. })) => {
            if args.output == ReportFormat::Text {
                return Err(Error::Signature(e));
            }
            Vec::new()
        }
        Err(e) if args.output == ReportFormat::Json => {
            return json_failure(&pinned, Error::Signature(e));
        }
        Err(e) => return Err(Error::Signature(e)),
    };
    match args.output {
        ReportFormat::Text => {
            let mut text = format!("{}{pinned}: verified\n", crate::oci::SCHEME);
            for s in &signatures {
                text.push_str(&format!("  signed by {} ({})\n", s.signer, s.format));
            }
            emit(&text)?;
        }
        ReportFormat::Json => {
            let report = Report {
                reference: format!("{}{pinned}", crate::oci::SCHEME),
                verified: failed.is_none(),
                signatures,
                error: failed.clone(),
            };
            emit(&format!(
                "{}\n",
                serde_json::to_string_pretty(&report).map_err(Error::Report)?
            ))?;
        }
    }
    Ok(if failed.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// With `-o json`, a check that could not run is reported too (and exits 2).
fn json_failure(reference: &crate::oci::Reference, e: Error) -> Result<ExitCode, Error> {
    eprintln!("error: {e}");
    let report = Report {
        reference: format!("{}{reference}", crate::oci::SCHEME),
        verified: false,
        signatures: Vec::new(),
        error: Some(e.to_string()),
    };
    emit(&format!(
        "{}\n",
        serde_json::to_string_pretty(&report).map_err(Error::Report)?
    ))?;
    Ok(e.exit_code())
}
