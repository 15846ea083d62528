//! Who may act: the four roles, ordered (reader < operator < approver < admin), and the bound on
//! a subject's length. A leaf below `auth` and `oidc`, which both name them.

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
