//! Who may talk to the coordinator. Workers prove themselves with a client certificate
//! signed by the workers' CA (mutual TLS, checked by the TLS layer; the worker RPCs require
//! that one was presented). Submitters send a bearer token; the coordinator keeps only
//! tokens' SHA-256 (`submitters.toml`), each mapped to the datasets it may charge and the
//! prefix its releases go to. A submitter sees only its own jobs, whose ids it namespaces
//! (`<name>.<job id>`), and writes only under its own output root: the coordinator's
//! credentials reach far more than any one submitter should.
//!
//! ```toml
//! [[submitter]]
//! name = "analytics"
//! token_sha256 = "…"   # `rhosynth token` prints a token and its hash
//! datasets = ["mimic-iv-ed-2026"]
//! output_root = "s3://releases/analytics/"
//! ```
//!
//! [`Access::Open`] admits everyone: `serve --dev`, which refuses to listen beyond
//! loopback. [`Access::InProcess`] admits workers only: standalone `run` and `audit`, whose
//! process starts its own job, so no other local user can submit one to their port (its
//! workers are not authenticated: a local process may still register as one).

use rhosynth_shared::storage;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

/// One declared submitter.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submitter {
    pub name: String,
    /// Hex SHA-256 of the bearer token.
    token_sha256: String,
    /// Dataset ids this submitter may run jobs on.
    pub datasets: Vec<String>,
    /// Every job's output prefix must lie under this one (a path or `s3://` URL).
    pub output_root: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmittersFile {
    submitter: Vec<Submitter>,
}

/// How the coordinator admits its peers.
#[derive(Clone, Debug, Default)]
pub enum Access {
    /// No authentication (loopback only).
    #[default]
    Open,
    /// Workers by mutual TLS, submitters by token.
    Authenticated { submitters: Vec<Submitter> },
    /// Workers only (loopback): the process submits its own job, not over RPC.
    InProcess,
}

/// Hex SHA-256 of a token, as `submitters.toml` stores it.
pub fn token_sha256(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

/// Whether two equal-length strings are equal, in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Access {
    /// Reads `submitters.toml`.
    pub fn load_submitters(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: cannot read: {e}"))?;
        let file: SubmittersFile = toml::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        for s in &file.submitter {
            // A name prefixes its jobs' ids (`<name>.<job id>`), so it may not hold a dot.
            if rhosynth_shared::spec::validate_id("submitter name", &s.name).is_err() || s.name.contains('.') {
                return Err(format!("{path}: submitter '{}': names use letters, digits, '_' and '-'", s.name));
            }
            let (scheme, root) = storage::canonical_url(&s.output_root);
            let depth = root.split('/').filter(|p| !p.is_empty()).count();
            let absolute = s.output_root.starts_with('/') || s.output_root.contains("://");
            // A bucket or a filesystem root would hold every other location.
            if scheme == "other" || !absolute || depth < 2 || s.output_root.split('/').any(|p| p == "..") {
                return Err(format!(
                    "{path}: submitter '{}': output_root must be an absolute path or s3:// URL at least two levels \
                     deep, without '..'",
                    s.name
                ));
            }
            if s.token_sha256.len() != 64 || !s.token_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{path}: submitter '{}': token_sha256 must be 64 hex digits", s.name));
            }
        }
        // A name is a namespace of jobs and ledger charges, a token one submitter's, and one
        // submitter's releases are never another's to write.
        for (i, a) in file.submitter.iter().enumerate() {
            for b in &file.submitter[i + 1..] {
                if b.name == a.name {
                    return Err(format!("{path}: submitter '{}' is declared twice", b.name));
                }
                if b.token_sha256.eq_ignore_ascii_case(&a.token_sha256) {
                    return Err(format!("{path}: submitters '{}' and '{}' have the same token", a.name, b.name));
                }
                if storage::nested(&a.output_root, &b.output_root) {
                    return Err(format!("{path}: the output roots of '{}' and '{}' overlap", a.name, b.name));
                }
            }
        }
        Ok(Access::Authenticated { submitters: file.submitter })
    }

    /// Admits a worker RPC: the connection presented a certificate the TLS layer verified
    /// against the workers' CA.
    pub fn worker<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match self {
            Access::Open | Access::InProcess => Ok(()),
            Access::Authenticated { .. } if request.peer_certs().is_some_and(|c| !c.is_empty()) => Ok(()),
            Access::Authenticated { .. } => {
                Err(Status::unauthenticated("worker RPCs need a client certificate signed by the workers' CA"))
            }
        }
    }

    /// Admits a submitter RPC; `None` under [`Access::Open`].
    pub fn submitter<T>(&self, request: &Request<T>) -> Result<Option<&Submitter>, Status> {
        let submitters = match self {
            Access::Open => return Ok(None),
            Access::InProcess => {
                return Err(Status::permission_denied("this coordinator runs its own process's job only"));
            }
            Access::Authenticated { submitters } => submitters,
        };
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("a bearer token is required (rhosynth submit --token-file)"))?;
        let hash = token_sha256(token.trim());
        submitters
            .iter()
            .find(|s| constant_time_eq(s.token_sha256.to_ascii_lowercase().as_bytes(), hash.as_bytes()))
            .map(Some)
            .ok_or_else(|| Status::unauthenticated("unknown bearer token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_by_their_hash_only() {
        let alice = Submitter {
            name: "alice".into(),
            token_sha256: token_sha256("s3cret"),
            datasets: vec![],
            output_root: "s3://releases/alice".into(),
        };
        let access = Access::Authenticated { submitters: vec![alice] };
        let with = |value: &str| {
            let mut request = Request::new(());
            request.metadata_mut().insert("authorization", value.parse().unwrap());
            request
        };
        assert_eq!(access.submitter(&with("Bearer s3cret")).unwrap().unwrap().name, "alice");
        assert_eq!(access.submitter(&with("Bearer wrong")).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(access.submitter(&with("s3cret")).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(access.submitter(&Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
        // Without TLS there is no verified client certificate.
        assert_eq!(access.worker(&Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(Access::Open.worker(&Request::new(())).is_ok());
        assert!(Access::InProcess.worker(&Request::new(())).is_ok());
        assert_eq!(Access::InProcess.submitter(&Request::new(())).unwrap_err().code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn a_name_and_a_token_are_one_submitters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("submitters.toml");
        let load = |declared: &[(&str, &str)]| {
            let text: String = declared
                .iter()
                .enumerate()
                .map(|(i, (name, token))| {
                    format!(
                        "[[submitter]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\ndatasets = []\n\
                         output_root = \"/srv/out/{i}\"\n",
                        token_sha256(token)
                    )
                })
                .collect();
            std::fs::write(&path, text).unwrap();
            Access::load_submitters(path.to_str().unwrap()).map(|_| ())
        };
        assert!(load(&[("alice", "a"), ("bob", "b")]).is_ok());
        let err = load(&[("alice", "a"), ("alice", "b")]).unwrap_err();
        assert!(err.contains("'alice' is declared twice"), "{err}");
        let err = load(&[("alice", "a"), ("bob", "a")]).unwrap_err();
        assert!(err.contains("the same token"), "{err}");
    }

    #[test]
    fn output_roots_are_deep_and_disjoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("submitters.toml");
        let load = |roots: &[&str]| {
            let text: String = roots
                .iter()
                .enumerate()
                .map(|(i, root)| {
                    format!(
                        "[[submitter]]\nname = \"s{i}\"\ntoken_sha256 = \"{}\"\ndatasets = []\noutput_root = \"{root}\"\n",
                        token_sha256(&i.to_string())
                    )
                })
                .collect();
            std::fs::write(&path, text).unwrap();
            Access::load_submitters(path.to_str().unwrap()).map(|_| ())
        };
        assert!(load(&["s3://releases/alice", "s3://releases/bob", "/srv/out/carol"]).is_ok());
        for (roots, expected) in [
            (&["s3://releases/alice", "s3a://releases/alice/nightly"][..], "overlap"),
            (&["s3://releases/"][..], "two levels"),
            (&["/"][..], "two levels"),
            (&["relative/out"][..], "two levels"),
            (&["/srv/out/../x"][..], "two levels"),
        ] {
            let err = load(roots).unwrap_err();
            assert!(err.contains(expected), "{roots:?}: {err}");
        }
    }
}
