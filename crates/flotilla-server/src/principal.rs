//! Who may act: the four roles, ordered (reader < operator < approver < admin), the bound on a
//! subject's length, and the random secrets callers are known by (tokens, sessions). A leaf
//! below `auth`, `oidc` and `sessions`, which all name them.

use std::io::Read;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Operator,
    Approver,
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "reader" => Some(Role::Reader),
            "operator" => Some(Role::Operator),
            "approver" => Some(Role::Approver),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }
}

/// The longest subject (a token's, or one made from an identity provider's claims).
pub const SUBJECT_MAX: usize = 256;

/// Random bytes from the kernel's CSPRNG, as hex. There is no fallback: a token guessable from
/// the clock is worse than no token.
pub fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("cannot read the system's random source /dev/urandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
